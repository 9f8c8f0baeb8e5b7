"""What the trainers on a fixed data set (``accel-sft``, ``accel-dpo``, ``accel-rm``) share, so that no recipe imports
another: rows checked message by message (``messages.py``), conversations rendered with the chat template and their
loss masks (``masks.py``), the model directory and its tokenizer (``model_files.py``), a run's global batches over
the data (``epochs.py``), sequences laid out as packed or padded micro-batches (``sequences.py``), and preference
pairs: their formats (``pairs.py``), data sets (``pair_data.py``) and micro-batches (``pair_batches.py``)."""
