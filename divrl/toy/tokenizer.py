"""The toy world's tokenizer: characters plus a fixed list of multi-character pieces.

Every printable ASCII character and the newline is a token, and so is each piece in
:data:`PIECES` (SQL keywords, the question templates' fixed words, the answer marker), so
sequences are about half as long as pure characters while names, numbers and constants
stay character by character (the model copies them from the question). The vocabulary is
written down, not learned, so the tokenizer is the same on every machine and seed.
Splitting is greedy left to right, longest piece first; decoding concatenates, so any
ASCII text round-trips exactly. Saved as a ``PreTrainedTokenizerFast``; it reloads with
``AutoTokenizer.from_pretrained`` next to a Llama config.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"

#: The fixed string every prompt ends with; responses start right after it.
ANSWER_MARKER = "\nA: "

PIECES: tuple[str, ...] = (
    ANSWER_MARKER,
    # SQL
    "SELECT ",
    " FROM ",
    " WHERE ",
    "COUNT(",
    "SUM(",
    "MAX(",
    "MIN(",
    " ORDER BY ",
    " DESC",
    " LIMIT 1",
    " JOIN ",
    " ON ",
    " NOT IN (",
    " IN (",
    "WITH s AS (",
    "(SELECT ",
    ") SELECT ",
    "a.nm",
    "b.nm",
    "b.id",
    # question templates
    "SQL: ",
    "Math: ",
    "how many ",
    " have ",
    "which ",
    " has the ",
    "highest ",
    "lowest ",
    "names of ",
    " not in ",
    " in ",
    "total ",
    " of ",
    " with ",
    " bags of ",
    " boxes of ",
    " and ",
    " more. ",
    " broke. ",
    "how many left?",
    "had ",
    ", lost ",
    ", got ",
    "how many now?",
    # math solutions
    ". \\boxed{",
    "\\boxed{",
)

CHARACTERS: tuple[str, ...] = ("\n", *(chr(i) for i in range(32, 127)))


def vocabulary(extra_pieces: Sequence[str] = ()) -> dict[str, int]:
    """token -> id: the special tokens, the characters, the pieces, then ``extra_pieces``
    (another toy world's own; appended, so the shared ids do not move)."""
    tokens = [PAD, EOS, UNK, *CHARACTERS, *PIECES, *extra_pieces]
    if len(set(tokens)) != len(tokens):
        raise AssertionError("duplicate token in the toy vocabulary")
    return {t: i for i, t in enumerate(tokens)}


def build_tokenizer(
    model_max_length: int = 256, extra_pieces: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """The toy tokenizer (pad, eos and unk set; no special tokens added on encode), with
    ``extra_pieces`` as further multi-character tokens."""
    pieces = (*PIECES, *extra_pieces)
    pattern = "|".join(re.escape(p) for p in sorted(pieces, key=len, reverse=True))
    tok = Tokenizer(models.WordLevel(vocabulary(extra_pieces), unk_token=UNK))
    # every match is its own piece: a listed piece (longest first) or else one character
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern + r"|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
