r"""Math agreement cases.

``CASES``: (completion, gold), labelled at test time: by math-verify itself for the
``math_verify`` profile, and for the training profile by math-verify's verdict on the final
answer a reference extraction finds (the MATH grader's last box, else an answer tag, phrase,
``####`` or a completion that is only an answer; nothing else), with ``FINAL_ANSWER_LABELS``
where the documented equivalences say otherwise. Written from the kinds of inputs in
Math-Verify's test suite (tests/test_all.py, test_numina cases): no box, several boxes,
truncated boxes, separators, sets, intervals, fractions, decimals, percentages, equations,
text around answers.

``FINAL_ANSWER_CASES``: (completion, gold, label, class), labelled by hand with what the
final-answer rule of the MATH grader and verl's DAPO scorer gives (the last box; "Answer:"
lines), equivalence judged mathematically.
"""

# (completion, gold)
HAND_CASES = [
    # no \boxed{}: math-verify's LaTeX / expression targets
    ("$x \\geq 5$", "5"),
    ("x equals $\\frac{1}{2}$", "2"),
    ("x equals $\\frac{1}{2}$", "\\frac{1}{2}"),
    ("The total is $14{,}916$", "916"),
    ("The total is $14{,}916$", "14916"),
    ("Maybe 4 or 7", "7"),
    ("Maybe 4 or 7", "4"),
    ("The answer is 42.", "42"),
    ("The answer is 42.", "24"),
    ("Answer: 3/4", "\\frac{3}{4}"),
    ("Answer: 0.75", "\\frac{3}{4}"),
    (
        "So the final answer is $\\frac{\\sqrt{3}}{2}$. I hope it is correct.",
        "\\frac{\\sqrt{3}}{2}",
    ),
    ("The final answer is $3$. I hope it is correct.", "3"),
    ("The final answer is $3$. I hope it is correct.", "4"),
    ("Final answer: the value is 12", "12"),
    ("I think it's 1,234 dollars", "1234"),
    ("I think it's 1 234 dollars", "1234"),
    ("It is 50%", "50"),
    ("It is 50%", "0.5"),
    ("It is 50 percent", "50\\%"),
    ("We get $2\\sqrt{2}$", "\\sqrt{8}"),
    ("Therefore $\\pi/2$", "\\frac{\\pi}{2}"),
    ("so x = 6", "6"),
    ("so $x = 6$", "6"),
    ("the roots are $x=2$ and $x=3$", "2,3"),
    ("the roots are $2$ and $3$", "\\{2, 3\\}"),
    ("answer: $(1, 2)$", "(1,2)"),
    ("It is \\(\\frac{5}{6}\\)", "\\frac{5}{6}"),
    ("It is \\[\\frac{5}{6}\\]", "\\frac{5}{6}"),
    ("$$\\frac{7}{8}$$", "0.875"),
    ("I am not sure.", "3"),
    ("", "3"),
    ("   ", "3"),
    ("12", "12"),
    ("-12", "-12"),
    ("0", "0"),
    ("007", "7"),
    ("12", "13"),
    ("70+15=85", "85"),
    ("Q:37+48=30+40=70;7+8=15;70+15=85", "85"),
    ("4*9=36, 36+5=41. \\boxed{41}", "41"),
    ("4*9=36, 36+5=41. \\boxed{41}", "36"),
    ("4*9+5=41. \\boxed{42}", "42"),
    # several boxes
    ("\\boxed{(2,2)} and \\boxed{(6,2)}", "(2,2),(6,2)"),
    ("\\boxed{(2,2)}, \\boxed{(6,2)}", "(2,2),(6,2)"),
    ("\\boxed{2} or \\boxed{3}", "2,3"),
    ("\\boxed{2} and \\boxed{3}", "\\{2,3\\}"),
    ("First \\boxed{1}. Later, after checking, \\boxed{2}", "2"),
    ("First \\boxed{1}. Later, after checking, \\boxed{2}", "1"),
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("$\\boxed{3}$ and $\\boxed{4}$", "3,4"),
    # separators and quick-path traps
    ("\\boxed{32, 349}", "32349"),
    ("\\boxed{32,349}", "32349"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{1{,}000}", "1000"),
    ("\\boxed{1\\,000}", "1000"),
    ("\\boxed{1 000}", "1000"),
    ("\\boxed{85.0}", "85"),
    ("\\boxed{85.5}", "85"),
    ("\\boxed{0.3333333}", "\\frac{1}{3}"),
    ("\\boxed{0.33}", "\\frac{1}{3}"),
    ("\\boxed{+5}", "5"),
    ("\\boxed{05}", "5"),
    ("\\boxed{-0}", "0"),
    ("\\boxed{5.}", "5"),
    ("\\boxed{\\$5}", "5"),
    ("\\boxed{5\\%}", "5"),
    ("\\boxed{5\\%}", "0.05"),
    ("\\boxed{10^{3}}", "1000"),
    ("\\boxed{1e3}", "1000"),
    # sets, intervals, tuples
    ("\\boxed{\\{3, 2\\}}", "\\{2, 3\\}"),
    ("\\boxed{\\{1, 6\\}}", "\\{2, 3\\}"),
    ("\\boxed{(-2,2)}", "(-2, 2)"),
    ("\\boxed{[-2, 2]}", "(-2, 2)"),
    ("\\boxed{[-2, 2]}", "[-2, 2]"),
    ("\\boxed{(-\\infty, 3]}", "(-\\infty,3]"),
    ("\\boxed{(-\\infty, 3)}", "(-\\infty,3]"),
    ("\\boxed{(1,2) \\cup (3,4)}", "(1,2)\\cup(3,4)"),
    ("\\boxed{(3,4) \\cup (1,2)}", "(1,2)\\cup(3,4)"),
    ("\\boxed{3, 5}", "5, 3"),
    ("\\boxed{(3, 5)}", "(5, 3)"),
    ("\\boxed{x \\in [0, 1]}", "[0,1]"),
    ("\\boxed{\\emptyset}", "\\emptyset"),
    # fractions, radicals, pi
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{\\dfrac{5}{6}}", "\\frac{5}{6}"),
    ("\\boxed{\\tfrac{5}{6}}", "\\frac{5}{6}"),
    ("\\boxed{\\frac{2}{5}}", "\\frac{5}{6}"),
    ("\\boxed{\\frac56}", "\\frac{5}{6}"),
    ("\\boxed{5/6}", "\\frac{5}{6}"),
    ("\\boxed{-\\frac{6}{8}}", "-3/4"),
    ("\\boxed{\\frac{-3}{4}}", "-\\frac{3}{4}"),
    ("\\boxed{2^{1/2}}", "\\sqrt{2}"),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}"),
    ("\\boxed{5\\sqrt{2}}", "5\\sqrt{2}"),
    ("\\boxed{25\\sqrt{2}}", "5\\sqrt{2}"),
    ("\\boxed{\\sqrt{50}}", "5\\sqrt{2}"),
    ("\\boxed{2\\pi}", "2\\pi"),
    ("\\boxed{6.28}", "2\\pi"),
    ("\\boxed{\\pi r^2}", "r^2\\pi"),
    ("\\boxed{3 + 2\\sqrt{3}}", "2\\sqrt{3}+3"),
    # equations, variables, expressions
    ("\\boxed{x = 6}", "6"),
    ("\\boxed{x=6}", "x=6"),
    ("\\boxed{y = 2x + 1}", "y=2x+1"),
    ("\\boxed{y = 2x + 1}", "2x+1"),
    ("\\boxed{x^2 + 2x + 1}", "(x+1)^2"),
    ("\\boxed{(x+1)(x-1)}", "x^2-1"),
    ("\\boxed{x^2-1}", "x^2+1"),
    ("\\boxed{a+b}", "b+a"),
    ("\\boxed{2a}", "a+a"),
    ("\\boxed{x \\geq 5}", "[5, \\infty)"),
    ("\\boxed{x > 5}", "(5,\\infty)"),
    ("\\boxed{1 < x < 3}", "(1,3)"),
    # degrees, units, text
    ("\\boxed{30^\\circ}", "30"),
    ("\\boxed{30^{\\circ}}", "30^\\circ"),
    ("\\boxed{45 \\text{ degrees}}", "45"),
    ("\\boxed{12 \\text{ cm}}", "12"),
    ("\\boxed{12\\text{cm}^2}", "12"),
    ("\\boxed{\\text{(C)}}", "C"),
    ("\\boxed{C}", "\\text{C}"),
    ("\\boxed{\\text{Monday}}", "\\text{Monday}"),
    ("\\boxed{\\textbf{(A)}\\ 5}", "5"),
    # matrices
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    (
        "\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}",
        "\\begin{pmatrix}1&2\\\\3&5\\end{pmatrix}",
    ),
    # box variants
    ("\\boxed 5", "5"),
    ("so \\boxed 5$", "5"),
    ("\\fbox{7}", "7"),
    ("\\boxed{{7}}", "7"),
    ("$\\boxed{7}$.", "7"),
    ("The answer is $\\boxed{7}$.", "7"),
    ("The answer is $\\boxed{7}$.", "8"),
    ("<answer>4</answer>", "4"),
    ("<think>2+2</think> <answer>4</answer>", "4"),
    ("<answer>\\boxed{3}</answer>", "3"),
    ("\\boxed{\udcff}", "3"),
    ("\\boxed{}", "3"),
    ("\\boxed{ }", "3"),
    # gsm8k-style endings (the math profile reads them through math-verify)
    ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
    ("She has 3 + 4 = 7 apples.\n#### 8", "7"),
    ("Total 1,000 + 250 = 1,250\n#### 1,250", "1250"),
]


def generated_cases() -> list[tuple[str, str]]:
    """Regular families: integers and fractions in several phrasings, right and wrong."""
    cases = []
    for _i, n in enumerate([3, 17, 250, 1024, 99999, -8]):
        cases += [
            (f"\\boxed{{{n}}}", str(n)),
            (f"\\boxed{{{n}}}", str(n + 1)),
            (f"Step one. The answer is $\\boxed{{{n}}}$.", str(n)),
            (f"so we get {n}", str(n)),
            (f"The final answer is ${n}$. I hope it is correct.", str(n)),
            (f"{n}", f"{n}.0"),
            (f"\\boxed{{{n}.0}}", str(n)),
        ]
    for a, b in [(1, 3), (2, 7), (5, 4), (10, 15), (-3, 8)]:
        cases += [
            (f"\\boxed{{\\frac{{{a}}}{{{b}}}}}", f"{a}/{b}"),
            (f"\\boxed{{{a}/{b}}}", f"\\frac{{{a}}}{{{b}}}"),
            (f"\\boxed{{{a / b:.4f}}}", f"\\frac{{{a}}}{{{b}}}"),
            (f"\\boxed{{{a / b:.1f}}}", f"\\frac{{{a}}}{{{b}}}"),
            (f"\\boxed{{\\frac{{{b}}}{{{a}}}}}", f"\\frac{{{a}}}{{{b}}}"),
            (f"\\boxed{{({a}, {b})}}", f"({a},{b})"),
            (f"\\boxed{{[{a}, {b}]}}", f"({a},{b})"),
        ]
    return cases


CASES = HAND_CASES + generated_cases()

# The last box is cut off: math-verify falls back to an earlier box (or reads the cut-off
# text); divrl scores these 0 with reason no_answer on purpose (docs/rewards.md).
TRUNCATED_CASES = [
    ("\\boxed{5} then \\boxed{7", "5"),
    ("\\boxed{5} then \\boxed{7", "7"),
    ("we get \\boxed{\\frac{1}{2", "\\frac{1}{2}"),
] + [(f"\\boxed{{{n}}} and finally \\boxed{{{n + 1}", str(n)) for n in (3, 250, -8)]


# Training-profile labels of CASES where the reference (math-verify on the final answer)
# and the documented equivalences differ: spaced thousands, a final full stop, a percent
# sign the MATH grader drops (so 5\% is 5, not 0.05), and inequalities read as their
# solution sets.
FINAL_ANSWER_LABELS = {
    ("\\boxed{1\\,000}", "1000"): 1.0,
    ("\\boxed{1 000}", "1000"): 1.0,
    ("\\boxed{5.}", "5"): 1.0,
    ("\\boxed{5\\%}", "5"): 1.0,
    ("\\boxed{5\\%}", "0.05"): 0.0,  # the MATH grader compares 5, not 0.05
    ("\\boxed{x \\geq 5}", "[5, \\infty)"): 1.0,
    ("\\boxed{x > 5}", "(5,\\infty)"): 1.0,
    ("\\boxed{1 < x < 3}", "(1,3)"): 1.0,
}

# (completion, gold, label, class)
FINAL_ANSWER_CASES = [
    # several boxes: the last one is the answer (a self-correction is rewarded)
    ("First \\boxed{2}. Wait, that is wrong; so \\boxed{3}.", "3", 1.0, "boxes"),
    ("First \\boxed{2}. Wait, that is wrong; so \\boxed{3}.", "2", 0.0, "boxes"),
    ("\\boxed{12} ... Let me re-check: 5+8=13, so \\boxed{13}", "13", 1.0, "boxes"),
    ("\\boxed{13} Hmm, actually \\boxed{12}", "13", 0.0, "boxes"),
    ("We had $\\boxed{\\frac{1}{2}}$, but correctly $\\boxed{\\frac{1}{3}}$.", "1/3", 1.0, "boxes"),
    ("\\boxed{(2,2)} and \\boxed{(6,2)}", "(2,2),(6,2)", 0.0, "boxes"),
    ("\\boxed{(2,2), (6,2)}", "(2,2),(6,2)", 1.0, "boxes"),
    ("\\boxed{2} or \\boxed{3}", "3", 1.0, "boxes"),
    ("\\boxed{2} or \\boxed{3}", "2", 0.0, "boxes"),
    ("\\boxed{5} and then \\boxed{7", "5", 0.0, "boxes"),
    # box variants
    ("\\fbox{7}", "7", 1.0, "box_variants"),
    ("\\fbox{8}", "7", 0.0, "box_variants"),
    ("The result is \\boxed {42}.", "42", 1.0, "box_variants"),
    ("\\boxed{ 42 }", "42", 1.0, "box_variants"),
    ("\\boxed  {9}", "9", 1.0, "box_variants"),
    ("so \\boxed 5$ is it", "5", 1.0, "box_variants"),
    ("$\\boxed{\\dfrac{3}{4}}$", "0.75", 1.0, "box_variants"),
    ("\\boxed{\\boxed{9}}", "9", 1.0, "box_variants"),
    ("\\boxed{}", "0", 0.0, "box_variants"),
    # answer tags
    ("<answer>42</answer>", "42", 1.0, "answer_tags"),
    ("<think>maybe 41</think><answer>42</answer>", "42", 1.0, "answer_tags"),
    ("<answer>41</answer>", "42", 0.0, "answer_tags"),
    ("<answer>The answer is $\\frac{1}{2}$</answer>", "0.5", 1.0, "answer_tags"),
    ("<answer>7 or 8</answer>", "8", 0.0, "answer_tags"),
    ("<answer>\\boxed{3}</answer>", "3", 1.0, "answer_tags"),
    ("<think>2+2</think> <answer> 4 ", "4", 1.0, "answer_tags"),
    ("<think>a draft: \\boxed{3}</think> <answer>4</answer>", "4", 1.0, "answer_tags"),
    ("<think>a draft: \\boxed{3}</think> <answer>4</answer>", "3", 0.0, "answer_tags"),
    ("<answer>4</answer> Checking again: \\boxed{5}", "5", 1.0, "boxes"),
    ("<answer>The answer is \\boxed{4}.</answer>", "4", 1.0, "answer_tags"),
    ("<answer>4</answer> wait, <answer> 5", "4", 0.0, "answer_tags"),
    # answer phrases
    ("The final answer is $3$. I hope it is correct.", "3", 1.0, "phrases"),
    ("Answer: 0.75", "\\frac{3}{4}", 1.0, "phrases"),
    ("**Final Answer:** 12", "12", 1.0, "phrases"),
    ("Final answer:\n$\\frac{1}{2}$", "0.5", 1.0, "phrases"),
    ("So the answer is 42.", "42", 1.0, "phrases"),
    ("So the answer is 42.", "24", 0.0, "phrases"),
    ("The answer is 7 or 8.", "7", 0.0, "phrases"),
    ("The answer is 7 or 8.", "8", 0.0, "phrases"),
    ("Final Answer: The final answer is $14$. I hope it is correct.", "14", 1.0, "phrases"),
    ("ANSWER: 14", "14", 1.0, "phrases"),
    ("The number is 42", "42", 0.0, "phrases"),
    # inequality vs interval, both ways
    ("\\boxed{x \\geq 5}", "[5, \\infty)", 1.0, "intervals"),
    ("\\boxed{[5, \\infty)}", "x \\geq 5", 1.0, "intervals"),
    ("\\boxed{x > 5}", "(5, \\infty)", 1.0, "intervals"),
    ("\\boxed{x \\geq 5}", "(5, \\infty)", 0.0, "intervals"),
    ("\\boxed{1 < x < 3}", "(1, 3)", 1.0, "intervals"),
    ("\\boxed{1 \\le x < 3}", "(1, 3)", 0.0, "intervals"),
    ("\\boxed{x \\le -2}", "(-\\infty, -2]", 1.0, "intervals"),
    ("\\boxed{(-\\infty, -2]}", "x \\le -2", 1.0, "intervals"),
    ("\\boxed{x < 2 \\text{ or } x > 3}", "(-\\infty,2)\\cup(3,\\infty)", 1.0, "intervals"),
    ("\\boxed{(-\\infty,2)\\cup(3,\\infty)}", "x<2 \\text{ or } x>3", 1.0, "intervals"),
    ("\\boxed{x < 2}", "(-\\infty,2)\\cup(3,\\infty)", 0.0, "intervals"),
    ("Thus $\\boxed{x < 4}$", "(-\\infty, 4)", 1.0, "intervals"),
    ("Thus $\\boxed{x \\leq 4}$", "(-\\infty, 4)", 0.0, "intervals"),
    ("\\boxed{-3 \\le x \\le 3}", "[-3,3]", 1.0, "intervals"),
    ("\\boxed{[-3,3]}", "-3 \\le x \\le 3", 1.0, "intervals"),
    # number formatting
    ("\\boxed{1,000}", "1000", 1.0, "numbers"),
    ("\\boxed{1\\,000}", "1000", 1.0, "numbers"),
    ("\\boxed{10\\,000}", "10000", 1.0, "numbers"),
    ("\\boxed{1 000 000}", "1000000", 1.0, "numbers"),
    ("\\boxed{2.50}", "2.5", 1.0, "numbers"),
    ("\\boxed{85.000}", "85", 1.0, "numbers"),
    ("\\boxed{5.}", "5", 1.0, "numbers"),
    ("\\boxed{1,234.50}", "1234.5", 1.0, "numbers"),
    ("\\boxed{32, 349}", "32349", 0.0, "numbers"),
    ("\\boxed{1,5}", "1.5", 0.0, "numbers"),
    ("\\boxed{12,000}", "1200", 0.0, "numbers"),
    ("\\boxed{5\\%}", "5", 1.0, "numbers"),
    ("\\boxed{50}", "50\\%", 1.0, "numbers"),
    ("\\boxed{5\\%}", "0.5", 0.0, "numbers"),
    ("\\boxed{2~500}", "2500", 1.0, "numbers"),
    ("\\boxed{\\$2,500.00}", "2500", 1.0, "numbers"),
    ("\\boxed{100\\%}", "1", 0.0, "numbers"),  # a percent is the number written: 100
    ("\\boxed{100\\%}", "100", 1.0, "numbers"),
    # hedges and text without a final answer: no last-number fallback
    ("It is either 7 or 8.", "7", 0.0, "hedges"),
    ("either 7 or 8", "8", 0.0, "hedges"),
    ("Maybe 4, maybe 7, or 9.", "9", 0.0, "hedges"),
    ("Candidates: 3, 5, 8", "8", 0.0, "hedges"),
    ("so x = 6", "6", 0.0, "hedges"),
    ("I think it's 1,234 dollars", "1234", 0.0, "hedges"),
    ("The answer is either 3 or 4, I can't tell.", "3", 0.0, "hedges"),
    ("It could be 10. Or 12. Possibly 14.", "14", 0.0, "hedges"),
    ("$x \\geq 5$ or $x = 7$", "7", 0.0, "hedges"),
    ("\\boxed{7 \\text{ or } 8}", "7", 0.0, "hedges"),
    ("12", "12", 1.0, "hedges"),
    ("$\\frac{1}{2}$", "0.5", 1.0, "hedges"),
    # a guess or a list of candidates inside the phrase, box or environment scores 0
    ("The answer is 7 (or 8).", "8", 0.0, "hedged answers"),
    ("The answer is 12 (or possibly 13).", "13", 0.0, "hedged answers"),
    ("The final answer is 12 (or 13).", "12", 0.0, "hedged answers"),
    ("\\boxed{7 \\lor 8}", "8", 0.0, "hedged answers"),
    ("\\boxed{3 \\vee 4}", "4", 0.0, "hedged answers"),
    ("\\boxed{7 \\approx 8}", "7", 0.0, "hedged answers"),
    ("\\boxed{\\approx 2.5}", "2.5", 0.0, "hedged answers"),
    ("The answer is $x \\sim 10$.", "10", 0.0, "hedged answers"),
    ("$\\boxed{\\begin{cases} 7 \\\\ 8 \\end{cases}}$", "8", 0.0, "hedged answers"),
    ("\\boxed{\\begin{array}{c} 5 \\\\ 6 \\end{array}}", "6", 0.0, "hedged answers"),
    ("The answer is probably 42.", "42", 0.0, "hedged answers"),
    ("Answer: approximately 3.14", "3.14", 0.0, "hedged answers"),
    ("**Answer:** roughly 100", "100", 0.0, "hedged answers"),
    # ... and the same forms where the gold is the set or the environment itself
    ("\\boxed{12 \\text{ or } 13}", "12, 13", 1.0, "hedged answers"),
    ("\\boxed{3 \\vee 4}", "3, 4", 1.0, "hedged answers"),
    (
        "\\boxed{\\begin{cases} 1 & x>0 \\\\ 0 & x \\le 0 \\end{cases}}",
        "\\begin{cases} 1 & x>0 \\\\ 0 & x \\le 0 \\end{cases}",
        1.0,
        "hedged answers",
    ),
    # bold, connectives, a self-check after the answer, units: the phrase's answer
    ("The final answer is **7**.", "7", 1.0, "phrase forms"),
    ("**Answer: 7**", "7", 1.0, "phrase forms"),
    ("So the final answer is __9__.", "9", 1.0, "phrase forms"),
    ("**Final answer:** 15", "15", 1.0, "phrase forms"),
    ("the answer is therefore 7", "7", 1.0, "phrase forms"),
    ("The answer is thus $\\frac{3}{4}$.", "3/4", 1.0, "phrase forms"),
    ("The answer is thus 8.", "9", 0.0, "phrase forms"),
    ("The answer is 7. Let me verify: 3+4=7, so the answer is correct.", "7", 1.0, "phrase forms"),
    (
        "Hence the answer is simply 20. Double-checking: 4*5=20, the answer is right.",
        "20",
        1.0,
        "phrase forms",
    ),
    ("The answer is 6. Checking again, the answer is 7.", "7", 1.0, "phrase forms"),
    ("The answer is 6. Checking again, the answer is 7.", "6", 0.0, "phrase forms"),
    ("The answer is 30 apples.", "30", 1.0, "phrase forms"),
    ("The answer is 31 apples.", "30", 0.0, "phrase forms"),
    ("She has 7 dollars left. The answer is 7 dollars.", "7", 1.0, "phrase forms"),
]
