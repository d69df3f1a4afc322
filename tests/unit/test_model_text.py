"""What messages may quote of untrusted text: escaped, one line, and at most 80 characters."""

from __future__ import annotations

from reconciler.model.errors import excerpt, printable


def test_printable_escapes_control_characters_and_keeps_the_rest() -> None:
    assert printable("NVIDIA A2-4Q") == "NVIDIA A2-4Q"
    assert printable("a\nb") == "a\\nb"
    assert printable("\x1b[1A\x1b[2Kok") == "\\x1b[1A\\x1b[2Kok"
    assert printable("right\u202eleft") == "right\\u202eleft"  # a bidi override reorders text
    assert printable("Grüße") == "Grüße"


def test_an_excerpt_is_at_most_80_characters_after_escaping() -> None:
    shadow = "root:$6$saltsalt$" + "x" * 200 + ":19000:0:99999:7:::\n"
    shown = excerpt(shadow)
    assert shown == "root:$6$saltsalt$" + "x" * 63 + "…"
    assert len(shown) == 81  # 80 characters and the mark
    # Escapes count: 30 ESC characters are 120 characters shown, so only 20 fit.
    assert excerpt("\x1b" * 30) == "\\x1b" * 20 + "…"


def test_an_excerpt_never_splits_an_escape_and_leaves_short_text_whole() -> None:
    assert excerpt("a" * 78 + "\n") == "a" * 78 + "\\n"  # exactly 80
    assert excerpt("a" * 79 + "\n") == "a" * 79 + "…"  # "\\n" would make 81: not half of it
    assert excerpt("short\tline") == "short\\tline"
    assert excerpt("") == ""
    assert excerpt("x" * 80) == "x" * 80
