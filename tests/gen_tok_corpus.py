#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/gen_tok_corpus.py - writes tests/data/tok_corpus.jsonl, the texts on which
tests/tok_oracle.sh compares the tokenizer.json backend with Hugging Face's library: one JSON
string a line. Hand-written cases for each thing a tokenizer treats specially (whitespace runs,
numbers, contractions, punctuation, accents in both normal forms, CJK, emoji sequences, special
tokens written in the text, partial ones, edges of the text), then long documents made from a
fixed seed, so the file is the same on every run. The committed file is this script's output:

    python3 tests/gen_tok_corpus.py > tests/data/tok_corpus.jsonl
"""
import json
import random
import sys

CASES = [
    # plain prose
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "In 1969, Neil Armstrong became the first person to walk on the Moon.",
    "hello",
    "Hello",
    "HELLO WORLD",
    "a",
    "I",
    "ab cd ef gh ij kl mn op qr st uv wx yz",
    # whitespace
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\r\n",
    "\n\n",
    "\n\n\n",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    " hello",
    "hello ",
    "  hello  ",
    "   leading three",
    "trailing three   ",
    "two  spaces  between  words",
    "many          spaces          here",
    " " * 100,
    "a" + " " * 40 + "b",
    "tab\tseparated\tvalues\there",
    "\t\tindented with tabs",
    "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\tdeep",
    "line one\nline two\nline three",
    "windows\r\nline\r\nendings\r\n",
    "old mac\rline\rendings",
    "mixed \t \n \r\n  \t\t\n end",
    "para one.\n\npara two.\n\n\npara three.",
    " \n \n \n",
    "trailing newline\n",
    "\nleading newline",
    "no\u00a0break\u00a0space",
    "ideographic\u3000space",
    "line\u2028separator and paragraph\u2029separator",
    "next\u0085line",
    "mongolian\u180evowel separator",
    "thin\u2009space and hair\u200aspace",
    "zero\u200bwidth\u200bspace",
    "soft\u00adhyphen",
    "\ufeffbyte order mark",
    "nul\u0000byte",
    "control \u0001\u0002\u0003\u007f chars",
    # numbers
    "0",
    "7",
    "42",
    "123",
    "1234",
    "12345",
    "1234567890",
    "3.14159265358979",
    "1,000,000",
    "1.000.000,50",
    "-273.15",
    "+1 (555) 123-4567",
    "v1.2.3-rc4",
    "0x7fffffff",
    "1e-10",
    "2024-01-15T10:30:00Z",
    "12:34:56.789",
    "".join(str(i % 10) for i in range(100)),
    "9" * 37,
    "\u0663\u0664\u0665 arabic-indic digits",
    "\u0967\u0968\u0969 devanagari digits",
    "\uff11\uff12\uff13 fullwidth digits",
    "x\u00b2 + y\u00b3 = z\u00b9",
    "Roman \u216b and \u2160\u2161\u2162",
    "\u2460\u2461\u2462 circled",
    "\u00bd \u00bc \u00be fractions",
    # contractions
    "it's",
    "don't",
    "they're",
    "I've",
    "I'm",
    "we'll",
    "he'd",
    "IT'S",
    "DON'T",
    "THEY'RE I'VE I'M WE'LL HE'D",
    "They'Re We'Ll",
    "'s",
    "''s",
    "'ll'd've",
    "rock 'n' roll",
    "the dog's bone and the dogs' bones",
    "it\u2019s curly",
    "it'\u017f long s",
    "o'clock",
    "'quoted'",
    # punctuation
    "!!!",
    "???",
    "...",
    "!?!?!?",
    "Wait... what?!",
    "--->",
    "<--",
    "((()))",
    "[[{{}}]]",
    "#$%^&*",
    "@user #hashtag",
    "email@example.com",
    "https://example.com/path?query=1&b=2#frag",
    "C:\\Users\\name\\file.txt",
    "``code`` and ```fenced```",
    "em\u2014dash and en\u2013dash",
    "\u201cdouble\u201d and \u2018single\u2019 quotes",
    "\u00abguillemets\u00bb",
    "a/b/c",
    "key=value;other=2",
    "!!! ??? ... ,,, ;;; ::: \"\"\" ''' ```",
    " ?",
    " ,",
    "\n!",
    # accents and normal forms
    "caf\u00e9",
    "cafe\u0301",
    "na\u00efve",
    "nai\u0308ve",
    "\u00c5ngstr\u00f6m",
    "\u212bngstr\u00f6m",
    "\u1e9b\u0323",
    "\ufb01nance and \ufb02ow",
    "\uff26\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48",
    "\u0130stanbul",
    "\u03a3\u0391\u03a3 \u03c3\u03b1\u03c2",
    "Stra\u00dfe",
    "\u00e0\u00e1\u00e2\u00e3\u00e4\u00e5\u00e6\u00e7\u00e8\u00e9\u00ea\u00eb",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dalgo",
    "\u1100\u1161\u11a8 jamo",
    "Ti\u1ebfng Vi\u1ec7t",
    # scripts
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002",
    "\u30ab\u30bf\u30ab\u30ca \u3072\u3089\u304c\u306a",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "Hello\u4e16\u754c",
    "\u4e2d\u6587123abc",
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "\u05e2\u05d1\u05e8\u05d9\u05ea",
    "\u0939\u093f\u0928\u094d\u0926\u0940",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
    "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8",
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522",
    "\ua66e rare",
    "\U00020000\U0002a6d6 ext-b",
    # emoji
    "\U0001f600",
    "I love it \U0001f60d\U0001f60d\U0001f60d",
    "\U0001f44d\U0001f3fd",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f1fa\U0001f1f8\U0001f1eb\U0001f1f7\U0001f1ef\U0001f1f5",
    "\u2764\ufe0f",
    "\U0001f3f3\ufe0f\u200d\U0001f308",
    "\U0001f9d1\u200d\U0001f4bb coding",
    "keycap 1\ufe0f\u20e3",
    "\u263a",
    # special tokens in the text
    "<s>",
    "</s>",
    "<s>Hello</s>",
    "<s> Hello </s>",
    "Hello <s>.",
    "<unk>",
    "<pad><eos><bos><mask>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|begin_of_text|>Hello<|end_of_text|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|im_start|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|endoftext|>",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<start_of_turn>",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "[multimodal]",
    "<unused0><unused99>",
    "<|im_sta",
    "<|im_start",
    "<|begin_of_text",
    "<s",
    "</s >",
    "< s>",
    "<<s>>",
    "<s><s><s>",
    "x<s>y</s>z",
    "<|im_start|><|im_end|>",
    "<start_of_image>",
    "\u2581\u2581two lower blocks",
    "\u2581 already a metaspace",
    "word\u2581\u2581\u2581\u2581word",
    # markup and code
    "<table><tr><td>cell</td></tr></table>",
    "<b>bold</b> <i>italic</i> <h1>Title</h1>",
    "<div class=\"x\">text</div>",
    "def f(x):\n    return x * 2\n",
    "int main(void) { return 0; }",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}",
    "$ ls -la | grep '.txt' > out.log 2>&1",
    "SELECT * FROM users WHERE id = 42;",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "x => x.map(y => y ** 2)",
    "#include <stdio.h>",
    "// comment\n/* block */",
    "    indented code",
    "\t\tif (a && b || !c) { x += 1; }",
]

WORDS = ("the of and to in is that for it as was with be by on not he this are or his "
         "from at which but have an they you were their one all we can her has there been "
         "if more when will would who so no time people year way day man thing woman life "
         "child world school state family student group country problem hand part place "
         "case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job "
         "word business issue side kind head house service friend father power hour game "
         "line end member law car city community name president team minute idea kid body "
         "information back parent face others level office door health person art war "
         "history party result change morning reason research girl guy moment air teacher "
         "force education").split()
EXTRA = ["caf\u00e9", "na\u00efve", "\u4e16\u754c", "\U0001f600", "don't", "it's", "I'm",
         "\u00fcber", "se\u00f1or", "\u0416\u0443\u043a", "\u03b1\u03b2\u03b3", "e\u0301",
         "<s>", "</s>", "<|im_start|>", "<|begin_of_text|>", "<start_of_turn>", "3.14",
         "2024", "100%", "(see above)", "e.g.", "U.S.A.", "\u2581x", "<unused1>"]


def document(rng, n_words):
    out = []
    for i in range(n_words):
        r = rng.random()
        if r < 0.06:
            w = rng.choice(EXTRA)
        elif r < 0.10:
            w = str(rng.randrange(0, 10 ** rng.randrange(1, 9)))
        else:
            w = rng.choice(WORDS)
            if rng.random() < 0.08:
                w = w.capitalize()
            if rng.random() < 0.02:
                w = w.upper()
        out.append(w)
        r = rng.random()
        if r < 0.06:
            out.append(rng.choice([".", ",", ";", ":", "!", "?", "...", "\u2014", " -"]))
        r = rng.random()
        if r < 0.02:
            out.append(rng.choice(["\n", "\n\n", "\r\n", "\t", "  ", "   ", "\n\n\n    "]))
        else:
            out.append(" ")
    return "".join(out).strip(" ")


CODE = '''#include <stdio.h>
#include <stdlib.h>

/* Sums the squares of the first n integers, the slow way. */
static long sum_squares(int n)
{
\tlong s = 0;

\tfor (int i = 1; i <= n; i++)
\t\ts += (long)i * i;
\treturn s;
}

int main(int argc, char **argv)
{
\tint n = argc > 1 ? atoi(argv[1]) : 10;

\tif (n < 0) {
\t\tfprintf(stderr, "n must be >= 0, got %d\\n", n);
\t\treturn 1;
\t}
\tprintf("sum of squares 1..%d = %ld\\n", n, sum_squares(n));
\treturn 0;
}
'''

PY = '''import json, sys


def main(path):
    """Prints the keys of a JSON file, sorted, one a line."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    for key in sorted(data):
        print(f"{key!r:>20} -> {type(data[key]).__name__}")  # aligned
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
'''


def main():
    rng = random.Random(20240501)
    cases = list(CASES)
    for n in (400, 700, 1000):
        cases.append(document(rng, n))
    cases.append(CODE)
    cases.append(PY)
    cases.append("\n".join(CASES[:60]))
    cases.append("".join(rng.choice(EXTRA + WORDS + [" ", "\n", "\t", "  "]) for _ in range(900)))
    for c in cases:
        sys.stdout.write(json.dumps(c, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
