from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, LlamaConfig

from divrl.toy.tokenizer import ANSWER_MARKER, build_tokenizer

TOK = build_tokenizer()
ASCII = st.text(alphabet=st.sampled_from([chr(i) for i in range(32, 127)] + ["\n"]), max_size=80)


@settings(max_examples=200, deadline=None)
@given(ASCII)
def test_ascii_round_trips_exactly(text):
    ids = TOK(text)["input_ids"]
    assert TOK.decode(ids) == text


def test_pieces_shorten_sql_and_spaces_survive():
    text = "SQL: how many dog  have kg>=3?" + ANSWER_MARKER
    ids = TOK(text)["input_ids"]
    assert len(ids) < len(text) - 10
    assert TOK.decode(ids) == text
    assert TOK.convert_ids_to_tokens(TOK(ANSWER_MARKER)["input_ids"]) == [ANSWER_MARKER]


def test_prompt_then_response_tokenizes_like_the_concatenation():
    prompt = "SQL: names of dog not in club ox?" + ANSWER_MARKER
    response = "SELECT nm FROM dog WHERE club NOT IN (SELECT id FROM club WHERE nm='ox')"
    joint = TOK(prompt + response)["input_ids"]
    assert joint == TOK(prompt)["input_ids"] + TOK(response)["input_ids"]


def test_special_tokens_and_reload(tmp_path):
    assert TOK.eos_token == "<eos>" and TOK.pad_token == "<pad>"
    assert TOK.eos_token_id != TOK.pad_token_id
    TOK.save_pretrained(tmp_path)
    LlamaConfig(vocab_size=len(TOK)).save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = "had 40 pens, lost 15, got 8.\n  \\boxed{33}"
    assert again(text)["input_ids"] == TOK(text)["input_ids"]
    assert (
        again.decode(again(text)["input_ids"] + [again.eos_token_id], skip_special_tokens=True)
        == text
    )
    assert again.eos_token_id == TOK.eos_token_id and again.pad_token_id == TOK.pad_token_id
