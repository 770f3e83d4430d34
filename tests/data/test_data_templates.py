import pytest

from divrl.data import R1_TEMPLATE, Example, register_template, render_prompt, template_names

CHAT = Example(
    "1",
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    "math",
    "4",
)
PLAIN = Example("2", "Q:37+48=", "toy_math", "85")


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    )
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return tok


def test_plain_is_the_prompt_as_is():
    assert render_prompt(PLAIN) == "Q:37+48="
    assert render_prompt(CHAT, "plain") == "Be brief.\n\nWhat is 2+2?"


def test_chat_uses_the_tokenizer_template(tokenizer):
    assert render_prompt(CHAT, "chat", tokenizer) == (
        "<|system|>Be brief.\n<|user|>What is 2+2?\n<|assistant|>"
    )
    assert render_prompt(PLAIN, "chat", tokenizer) == "<|user|>Q:37+48=\n<|assistant|>"
    with pytest.raises(ValueError, match="needs a tokenizer"):
        render_prompt(CHAT, "chat")
    tokenizer_without = type(tokenizer)(tokenizer_object=tokenizer.backend_tokenizer)
    with pytest.raises(ValueError, match="no chat template"):
        render_prompt(CHAT, "chat", tokenizer_without)


def test_r1_template():
    text = render_prompt(PLAIN, "r1")
    assert text == R1_TEMPLATE.format(prompt="Q:37+48=")
    assert "<think> </think>" in text and "<answer> </answer>" in text
    assert text.endswith("User: Q:37+48=\nAssistant:")


def test_registry():
    assert {"plain", "chat", "r1"} <= set(template_names())
    with pytest.raises(ValueError, match="unknown prompt template 'nope'"):
        render_prompt(PLAIN, "nope")

    @register_template("test_shout")
    def shout(example, tokenizer=None):
        return str(example.prompt).upper()

    assert render_prompt(PLAIN, "test_shout") == "Q:37+48="
    assert render_prompt(Example("3", "abc", "math", "1"), "test_shout") == "ABC"

    def whisper(example, tokenizer=None):
        return str(example.prompt).lower()

    with pytest.raises(ValueError, match=r"'test_shout' is already registered .*replace=True"):
        register_template("test_shout")(whisper)
    assert render_prompt(PLAIN, "test_shout") == "Q:37+48="  # the first one is kept
    register_template("test_shout")(shout)  # the same function again: a no-op
    register_template("test_shout", replace=True)(whisper)
    assert render_prompt(PLAIN, "test_shout") == "q:37+48="
