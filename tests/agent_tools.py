"""Tools and environments for the agent tests: good ones, one written to TRL's ``environment_factory`` contract,
and each kind of bad one the config check must name."""

import sys
import time

CONCURRENT = {"now": 0, "most": 0}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of two integers.

    Args:
        expression: Two integers and an operator, for example "3 + 4".
    """
    left, op, right = expression.split()
    a, b = int(left), int(right)
    return str({"+": a + b, "-": a - b, "*": a * b}[op])


def lookup(key: str, default: int = 0) -> dict:
    """Look a key up.

    Args:
        key: The key.
        default: Returned when the key is unknown.
    """
    return {"key": key, "value": len(key) or default}


def sleepy(seconds: float) -> str:
    """Sleep, then answer; records how many calls run at once.

    Args:
        seconds: How long to sleep.
    """
    CONCURRENT["now"] += 1
    CONCURRENT["most"] = max(CONCURRENT["most"], CONCURRENT["now"])
    try:
        time.sleep(seconds)
    finally:
        CONCURRENT["now"] -= 1
    return "slept"


def broken(x: int) -> str:
    """Always raises.

    Args:
        x: Anything.
    """
    raise RuntimeError(f"broken tool got {x}")


def quitter(code: int) -> str:
    """Calls sys.exit().

    Args:
        code: The exit status.
    """
    sys.exit(code)


def verbose(words: int) -> str:
    """A long answer.

    Args:
        words: How many words.
    """
    return " ".join(["apples"] * words)


def undocumented(x: int) -> int:
    return x


def untyped(x):
    """No type hints.

    Args:
        x: Anything.
    """
    return x


NOT_A_FUNCTION = 3


class CounterEnv:
    """Written to TRL's environment_factory contract: built with no arguments, reset(**row) gets the dataset row
    and may return text for the prompt, every public method is a tool, the trainer passes the instances to the
    reward functions (``environments=``)."""

    def __init__(self):
        self.total = 0
        self.target = None

    def reset(self, **kwargs) -> str | None:
        self.total = 0
        self.target = int(kwargs.get("answer", 0))
        return f" Reach {self.target}."

    def add(self, amount: int) -> str:
        """Add to the running total.

        Args:
            amount: How much to add.
        """
        self.total += amount
        return f"total is {self.total}"

    def _helper(self):  # private: not a tool
        return None


class RewardingEnv(CounterEnv):
    def get_reward(self) -> float:
        return 1.0 if self.total == self.target else 0.0


class NoResetEnv:
    def add(self, amount: int) -> str:
        """Add.

        Args:
            amount: How much.
        """
        return str(amount)


class ConfiguredEnv(CounterEnv):
    """Needs an argument to be built: the trainer builds one per trajectory with none."""

    def __init__(self, target: int):
        super().__init__()
        self.target = target


class DeafEnv(CounterEnv):
    """Its reset() cannot take the data row."""

    def reset(self):
        self.total = 0


class UndocumentedEnv:
    def reset(self, **kwargs):
        return None

    def act(self, move: str) -> str:
        return move


def reached_target(completions, environments, **kwargs):
    """TRL-style reward reading the environment's state."""
    return [1.0 if env.total == env.target else 0.0 for env in environments]


def correct_answer(completions, answer, **kwargs):
    """TRL-style: 1.0 when the last message's last number is the answer."""
    import re

    values = []
    for messages, want in zip(completions, answer, strict=True):
        numbers = re.findall(r"-?\d+", messages[-1]["content"] or "")
        values.append(1.0 if numbers and numbers[-1] == str(want) else 0.0)
    return values


def arithmetic_rows(count=12):
    """Data rows "What is A op B?" with their answers."""
    rows = []
    for index in range(count):
        a, b, op = 3 + index * 7 % 20, 2 + index * 5 % 9, "+-*"[index % 3]
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} {op} {b}?"}],
                     "answer": calculator(f"{a} {op} {b}")})
    return rows
