"""Why a profile or GPU model name that is not printable ASCII cannot be NVIDIA's, in words.

NVIDIA's driver names every vGPU type and GPU in ASCII (``NVIDIA A2-4Q``, ``GRID A100D-4C``), so
a letter from another script in a desired state is a mistake or a disguise: a Cyrillic ``А2-4A``
reads as ``A2-4A`` on screen and in review, yet is another name to the catalogue and the host.
``checks`` refuses such names; this module says which character it is (its Unicode name) and,
for the usual look-alikes, which ASCII character it imitates.
"""

from __future__ import annotations

#: Letters of other scripts drawn like ASCII ones (Unicode's confusables.txt, the Cyrillic and
#: Greek rows that map to one ASCII letter). Fullwidth and styled forms (``Ａ``, ``𝐀``) are
#: found by NFKC instead.
LOOK_ALIKES: dict[str, str] = {
    # Cyrillic capitals and small letters
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P",
    "С": "C", "Т": "T", "Х": "X", "У": "Y", "Ѕ": "S", "І": "I", "Ј": "J", "Ԛ": "Q",
    "Ԝ": "W", "Ү": "Y", "Һ": "h", "Ӏ": "I", "З": "3", "Ь": "b",
    "а": "a", "в": "B", "е": "e", "к": "k", "м": "M", "н": "H", "о": "o", "р": "p",
    "с": "c", "т": "T", "х": "x", "у": "y", "ѕ": "s", "і": "i", "ј": "j", "ԛ": "q",
    "ԝ": "w", "ү": "y", "һ": "h", "ӏ": "l", "ь": "b",
    # Greek capitals and small letters
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M",
    "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    "α": "a", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "υ": "u",
    "χ": "x", "γ": "y",
}  # fmt: skip


def non_ascii(name: str) -> str | None:
    """The first character of ``name`` outside printable ASCII, described; None when there is
    none. ``U+0410 CYRILLIC CAPITAL LETTER A, which looks like 'A'``; ``U+001B, a control
    character`` (an escape sequence in a name would drive the terminal that shows it).
    """
    for ch in name:
        if ch.isascii() and ch.isprintable():
            continue
        import unicodedata  # only for a name that has such a character (a C module to load)

        if unicodedata.category(ch) == "Cc":
            return f"U+{ord(ch):04X}, a control character"
        described = f"U+{ord(ch):04X} {unicodedata.name(ch, '(unnamed)')}"
        like = looks_like(ch)
        return f"{described}, which looks like '{like}'" if like else described
    return None


def looks_like(ch: str) -> str | None:
    """The ASCII character ``ch`` is drawn like, if it is a known look-alike."""
    if ch in LOOK_ALIKES:
        return LOOK_ALIKES[ch]
    import unicodedata

    folded = unicodedata.normalize("NFKC", ch)
    # Fullwidth 'Ａ', mathematical '𝐀', superscript '²': one printable ASCII character.
    if len(folded) == 1 and folded.isascii() and folded.isprintable() and folded != " ":
        return folded
    return None
