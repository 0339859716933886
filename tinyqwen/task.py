"""The task: generated multi-step arithmetic word problems in GSM8K's answer format.

A problem is a short story ("Ana has 7 pens. She gets 5 more. ...") whose answer is reached by a
chain of 1..max_ops operations; its reference solution writes each step and ends with
"#### <answer>", exactly the format verl's gsm8k scorer reads. Everything is a pure function of
(seed, settings), so both backends read the same problems.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rla.config import TASK, settings_class, task_settings

# verl's default reward routes this data_source to its gsm8k scorer (strict "#### <n>" format).
DATA_SOURCE = "openai/gsm8k"
ABILITY = "math"
# verl's GSM8K preparation appends a longer instruction; a short one keeps tiny-model sequences short.
INSTRUCTION = 'Answer after "####".'

NAMES = [("Ana", "She"), ("Ben", "He"), ("Cleo", "She"), ("Dan", "He"), ("Eva", "She"), ("Finn", "He")]
ITEMS = ["apples", "pens", "coins", "books", "cards", "stones"]
# op -> sentence template; {p} = pronoun, {n} = operand
OP_TEXT = {
    "+": "{p} gets {n} more.",
    "-": "{p} gives away {n}.",
    "*": "{p} ends up with {n} times as many.",
}
QUESTION = "How many {item} does {name} have now?"


class TaskSettings(settings_class("TaskSettings", "task", TASK)):
    """Difficulty knobs (the `task:` section of the experiment config): a field per key of
    `rla.config.TASK` (name, seed, n_train, n_test, min_ops, max_ops, max_operand, max_multiplier),
    with its default and check."""

    @classmethod
    def from_config(cls, section: dict | None, where: str = "task") -> "TaskSettings":
        return cls(**task_settings(section, where))


@dataclass(frozen=True)
class Problem:
    question: str
    solution: str  # worked steps + "#### <answer>"
    answer: str


def make_problem(rng: random.Random, s: TaskSettings) -> Problem:
    name, pronoun = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    value = rng.randint(1, s.max_operand)
    sentences = [f"{name} has {value} {item}."]
    steps = []
    for _ in range(rng.randint(s.min_ops, s.max_ops)):
        ops = ["+", "*"] + (["-"] if value > 1 else [])
        op = rng.choice(ops)
        if op == "+":
            n = rng.randint(1, s.max_operand)
            new = value + n
        elif op == "-":
            n = rng.randint(1, value - 1)  # answers stay positive
            new = value - n
        else:
            n = rng.randint(2, s.max_multiplier)
            new = value * n
        sentences.append(OP_TEXT[op].format(p=pronoun, n=n))
        steps.append(f"{value}{op}{n}={new}")
        value = new
    sentences.append(QUESTION.format(item=item, name=name))
    answer = str(value)
    return Problem(" ".join(sentences), " ".join(steps) + f" #### {answer}", answer)


def make_split(s: TaskSettings, split: str) -> list[Problem]:
    """Deterministic problems of one split; train and test use different streams of the seed."""
    n = {"train": s.n_train, "test": s.n_test}[split]
    rng = random.Random(f"{s.seed}-{split}")
    return [make_problem(rng, s) for _ in range(n)]


def chat_messages(question: str) -> list[dict]:
    """The prompt in verl's gsm8k layout: one user message, the question then the instruction."""
    return [{"role": "user", "content": f"{question} {INSTRUCTION}"}]


def render_prompt(messages: list[dict]) -> str:
    """The one chat rendering both sides use: 'role: content' lines, then the assistant's turn."""
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nassistant: "


# render_prompt as a tokenizer chat template, for models that verl prompts with
# `apply_chat_template(messages, add_generation_prompt=True)` (verlrun's built models).
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def score(response: str, ground_truth: str) -> float:
    """Reward through verl's own gsm8k scorer (strict: the answer must follow '#### ')."""
    from verl.utils.reward_score import gsm8k  # verl: optional, and the task's text needs none of it

    return float(gsm8k.compute_score(response, ground_truth, method="strict"))
