"""transformers' continuous batching (``generate_batch``, TRL's use_transformers_continuous_batching) against
``generate`` and the hf-continuous decode loop, on the CPU, interleaved in one process (one thread).

The same work as the rollout-engine benchmark: 16 prompts x 8 responses, up to 128 new tokens, temperature 1.0,
no truncation, on a model directory whose responses end at an EOS. Prints seconds per call (median, process CPU
time and wall time) and the response tokens produced.

Usage: python ci/measure/transformers_cb.py MODEL_DIR [ROUNDS]
   (MODEL_DIR from: accel-grpo make-tiny-model DIR --hidden-size 128 --layers 4 --vocab-size 2048 --eos-bias 0.33
    --single-eos)
"""
import statistics
import sys
import time

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(path: str, rounds: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from engine.bench.rollout import question_prompts
    from engine.rollout.engines import SamplingConfig, left_padded, mask_through_first_eos
    from engine.rollout.engines.hf_continuous import decode

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config = GenerationConfig()  # the model's sampling defaults set aside, as the engines do
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    prompts = question_prompts(tokenizer, 16, 0)
    ids, mask = left_padded(prompts, 8, pad)
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "eos_token_id": eos,
                "pad_token_id": pad}

    def generate():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=128, **sampling)[:, ids.size(1):]
        return int(mask_through_first_eos(out, [eos]).sum())

    def generate_batch():
        config = GenerationConfig(max_new_tokens=128, num_return_sequences=8, **sampling)
        outputs = model.generate_batch(prompts, generation_config=config, progress_bar=False)
        return sum(len(o.generated_tokens) for o in outputs.values())

    def continuous_loop():
        config = SamplingConfig(n=8, max_new_tokens=128, eos_token_ids=(eos,))
        return int(decode(model, ids, mask, config, pad).mask.sum())

    variants = {"generate": generate, "generate_batch": generate_batch, "hf-continuous": continuous_loop}
    cpu, wall, produced = ({name: [] for name in variants} for _ in range(3))
    with torch.no_grad():
        for run in variants.values():
            run()  # warm-up
        for index in range(rounds):
            for name, run in variants.items():
                torch.manual_seed(index)
                start_cpu, start_wall = time.process_time(), time.perf_counter()
                produced[name].append(run())
                cpu[name].append(time.process_time() - start_cpu)
                wall[name].append(time.perf_counter() - start_wall)
    for name in variants:
        print(f"{name:15} cpu {statistics.median(cpu[name]):6.2f} s, wall {statistics.median(wall[name]):6.2f} s, "
              f"{statistics.mean(produced[name]):.0f} tokens produced per call; cpu / generate per round: "
              f"{statistics.median(a / b for a, b in zip(cpu[name], cpu['generate'], strict=True)):.2f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
