#!/usr/bin/env python3
"""Writes a varied UTF-8 text for tokenizer checks (tests/test_hf_tokenizer.sh): English from
Debian's fortunes, and a seeded mix of scripts (CJK, Japanese, Korean, Arabic, Hebrew,
Devanagari, Thai, Cyrillic, Greek), decomposed accents (NFC), emoji with skin tones, flags
and joiners, numbers of every length, code, contractions in any case, whitespace runs and
line endings, and special tokens written as text.
usage: make_tokenizer_text.py OUT BYTES [SEED]"""
import glob, random, sys

out, size = sys.argv[1], int(sys.argv[2])
rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 28)
english = []
for p in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if p.endswith((".dat", ".u8")) or "off" in p:
        continue
    try:
        english += [e.strip("\n") for e in open(p, encoding="utf-8").read().split("\n%\n") if e.strip()]
    except (UnicodeDecodeError, IsADirectoryError):
        pass
if not english:
    english = ["The quick brown fox jumps over the lazy dog."]
snippets = [
    "你好，世界！今天天气很好，我们去公园散步吧。", "東京は日本の首都です。カタカナとひらがな、漢字。", "안녕하세요, 세계! 한국어 문장입니다.",
    "مرحبا بالعالم، هذه جملة عربية.", "שלום עולם, זה משפט בעברית.", "नमस्ते दुनिया, यह एक हिंदी वाक्य है।",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง", "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε, ελληνικά γράμματα.", "Cafe\u0301 na\u0308ive re\u0301sume\u0301 (decomposed)", "Café naïve résumé (composed)",
    "👍🏽👋🏿 🇫🇷🇯🇵 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️‍🔥 😀😃😄", "1 12 123 1234 12345 123456 1234567 3.14159 -42 1e10 0x1F",
    "def f(x):\n\treturn x ** 2  # square\n", "if (a != b && c <= d) { printf(\"%d\\n\", a); }",
    "I'LL DO IT, you'll see. He'S here; they'RE gone; we've 'd 'm", "tabs\t\there   spaces    and\r\nwindows\r\nlines\n\n\n",
    "<|endoftext|>", "<|begin_of_text|>", "<|im_start|>user\nhello<|im_end|>", "  leading and trailing   ",
    "Ünïcödé ß ẞ ﬁ ﬂ Å Ω µ ½ ² ℕ ∑ ∫ √ ∞", "\u00a0non\u00a0breaking\u2009thin\u3000ideographic space",
]
parts, n = [], 0
while n < size:
    s = rng.choice(english) if rng.random() < 0.6 else rng.choice(snippets)
    sep = rng.choice([" ", "\n", "\n\n", "  ", "\t", ""])
    parts.append(s + sep)
    n += len((s + sep).encode())
open(out, "w", encoding="utf-8").write("".join(parts))
