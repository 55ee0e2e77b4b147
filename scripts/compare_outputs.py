#!/usr/bin/env python3
"""Compare two runs' printed output: the same text, numbers equal within tolerance.

    python3 scripts/compare_outputs.py CPU.txt CUDA.txt [--rtol 1e-3] [--atol 1e-5] [--mask RE]...

Used by scripts/gpu-check.sh to check that an example prints the same thing on the GPU as on
the CPU. Both files are cut into numbers and the text between them. The text must be equal
(runs of spaces count as one: a wider number shifts a table's padding); two numbers a and b
agree when |a - b| <= atol + rtol * max(|a|, |b|) + one unit in the last printed digit of
the less precise of the two (a value printed as 0.1235 on one side and 0.1234 on the other is
a rounding, not a difference). Text matching a --mask regular expression (a duration, say) is
left out of both sides before they are compared. Prints a one-line summary and the first differences; exits 0
when the two agree, 1 otherwise.
"""
import argparse
import re
import sys

NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?inf|NaN|nan")


def split(text):
    """The text between numbers (spaces collapsed) and the numbers, as printed."""
    parts, numbers, last = [], [], 0
    for m in NUMBER.finditer(text):
        parts.append(" ".join(text[last : m.start()].split()))
        numbers.append(m.group())
        last = m.end()
    parts.append(" ".join(text[last:].split()))
    return parts, numbers


def ulp(s):
    """One unit in the last printed digit of the number written as `s`."""
    mant, _, exp = s.lower().partition("e")
    digits = len(mant.split(".")[1]) if "." in mant else 0
    return 10.0 ** (-digits + (int(exp) if exp else 0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--mask", action="append", default=[], help="regex left out of both")
    ap.add_argument("--show", type=int, default=8, help="differences to print")
    args = ap.parse_args()

    def read(path):
        text = open(path, encoding="utf-8", errors="replace").read()
        for m in args.mask:
            text = re.sub(m, "<masked>", text)
        return split(text)

    ta, na = read(args.a)
    tb, nb = read(args.b)
    problems = []
    if len(na) != len(nb):
        problems.append(f"{len(na)} numbers in {args.a}, {len(nb)} in {args.b}")
    for i, (x, y) in enumerate(zip(ta, tb)):
        if x != y:
            problems.append(f"text {i}: {x[-60:]!r} != {y[-60:]!r}")
    worst = 0.0
    for i, (x, y) in enumerate(zip(na, nb)):
        fx, fy = float(x), float(y)
        if fx == fy or (fx != fx and fy != fy):
            continue
        d = abs(fx - fy)
        worst = max(worst, d)
        if d > args.atol + args.rtol * max(abs(fx), abs(fy)) + max(ulp(x), ulp(y)):
            context = next((t for t in reversed(ta[: i + 1]) if t), "")[-40:]
            problems.append(f"number {i} after {context!r}: {x} != {y}")
    verdict = "SAME" if not problems else "DIFFERENT"
    print(
        f"{verdict}: {len(na)} numbers, largest difference {worst:.3g}, "
        f"{len(problems)} problems (rtol {args.rtol}, atol {args.atol})"
    )
    for p in problems[: args.show]:
        print("  " + p)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
