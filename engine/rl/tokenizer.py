"""A character-level Hugging Face tokenizer built in code: the CPU demo needs no downloads."""

from __future__ import annotations

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"


def build_char_tokenizer(alphabet: str):
    """One token per character of ``alphabet`` plus pad/bos/eos/unk; left padding, as generation wants."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(alphabet))  # unique, in order
    vocab = {token: index for index, token in enumerate([PAD, BOS, EOS, UNK, *chars])}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   unk_token=UNK, padding_side="left")
