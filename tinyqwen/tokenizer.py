"""A small byte-level BPE tokenizer for the task, in Qwen2's own form, built with `tokenizers`.

Same pieces as Qwen2's tokenizer (its pre-tokenizer regex, which splits digits one by one;
byte-level BPE; NFC; byte-level decoder), trained on task text to a few hundred tokens. The form
matters: `AutoTokenizer.from_pretrained` on a `model_type: qwen2` directory always rebuilds a
`Qwen2Tokenizer` from the saved vocab and merges, so only a Qwen2-form tokenizer survives the
round trip unchanged. Byte-level BPE also round-trips any text exactly.
"""

from __future__ import annotations

import random

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tinyqwen.task import TaskSettings, chat_messages, make_problem, render_prompt

PAD, EOS = "<|pad|>", "<|endoftext|>"
VOCAB_SIZE = 384
# transformers' Qwen2Tokenizer PRETOKENIZE_REGEX
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                           r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Task text covering every template (fixed: the tokenizer does not depend on the task config)."""
    rng, settings = random.Random(seed), TaskSettings(max_ops=4)
    texts = []
    for _ in range(n):
        p = make_problem(rng, settings)
        texts.append(render_prompt(chat_messages(p.question)) + p.solution)
    return texts


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """The task tokenizer as a transformers `PreTrainedTokenizerFast` (deterministic)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, padding_side="left",
                                   clean_up_tokenization_spaces=False)
