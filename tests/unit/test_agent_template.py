"""engine/rollout/multi_turn/template.py: tool results as the chat template renders them, and the start-up check that
refuses a template that is not prefix-preserving (or cannot render tools), naming the problem."""

import agent_tools
import pytest

from engine.demo_model import CHAT_TEMPLATE, build_tokenizer
from engine.rollout.multi_turn.template import check_template, encode, inserted_text, prompt_ids
from engine.rollout.multi_turn.tools import tool_schema

PLAIN_CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def schemas():
    return [tool_schema(agent_tools.calculator, "test")]


def with_template(tokenizer, template):
    tokenizer.chat_template = template
    return tokenizer


def test_the_fixture_template_passes_and_tool_results_are_the_rendering_difference(tokenizer, schemas):
    with_template(tokenizer, CHAT_TEMPLATE)
    assert check_template(tokenizer, schemas, "fixture") == []
    user = [{"role": "user", "content": "What is 3 + 4?"}]
    prompt = tokenizer.decode(prompt_ids(tokenizer, user, schemas))
    assert "calculator" in prompt and prompt.endswith("<|im_start|>assistant\n")
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "3 + 4"}}}]}
    results = [{"role": "tool", "name": "calculator", "content": "7"}, {"role": "tool", "name": "calculator",
                                                                          "content": "8"}]
    text = inserted_text(tokenizer, [*user, call], results, schemas, "<|im_end|>")
    # The newline after the model's <|im_end|> belongs to what is inserted (it is not the model's token).
    assert text == ("\n<|im_start|>user\n<tool_response>\n7\n</tool_response>\n<tool_response>\n8\n</tool_response>"
                    "<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.decode(encode(tokenizer, text)) == text
    assert inserted_text(tokenizer, [*user, call], results, schemas, "<|endoftext|>") is None  # not its turn end


def test_a_missing_template_and_one_without_tools_are_refused(tokenizer, schemas):
    (problem,) = check_template(with_template(tokenizer, None), schemas, "model.path /m")
    assert "the tokenizer of model.path /m has none" in problem
    (problem,) = check_template(with_template(tokenizer, PLAIN_CHATML), schemas, "model.path /m")
    assert "ignores the tools= argument" in problem
    raising = "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}" \
              "{{ m['content'] }}{% endfor %}{{ tools | tojson }}"
    (problem,) = check_template(with_template(tokenizer, raising), schemas, "model.path /m")
    assert "cannot render a tool call and a tool message" in problem and "no tools here" in problem


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer, schemas):
    # Like templates that drop an earlier turn's reasoning: the assistant's turn renders differently once a
    # later message follows it.
    rewriting = CHAT_TEMPLATE.replace(
        "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] or '' }}",
        "{% else %}<|im_start|>{{ message['role'] }}\n"
        "{% if message['role'] == 'assistant' and not loop.last %}(earlier) {% endif %}"
        "{{ message['content'] or '' }}")
    problems = check_template(with_template(tokenizer, rewriting), schemas, "model.path /m")
    assert len(problems) == 1 and "not prefix-preserving for tool messages" in problems[0]
    thinking = CHAT_TEMPLATE.replace("{% if add_generation_prompt %}<|im_start|>assistant\n",
                                     "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n")
    problems = check_template(with_template(tokenizer, thinking), schemas, "model.path /m")
    assert any("not prefix-preserving for the assistant's turn" in p for p in problems)
    with_template(tokenizer, CHAT_TEMPLATE)


def test_without_tools_the_fixture_template_renders_plain_chatml(tokenizer):
    default_system = ("{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>"
                      "system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
                      "{{ message['content'] }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    for messages in ([{"role": "user", "content": "hi\n"}],
                     [{"role": "system", "content": "S"}, {"role": "user", "content": "q"},
                      {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]):
        for generation_prompt in (True, False):
            rendered = []
            for template in (CHAT_TEMPLATE, default_system):
                tokenizer.chat_template = template
                rendered.append(tokenizer.apply_chat_template(messages, tokenize=False,
                                                              add_generation_prompt=generation_prompt))
            assert rendered[0] == rendered[1]
    tokenizer.chat_template = CHAT_TEMPLATE
