r"""Hand-labelled math cases: each label is what an official rule says, named beside it.

Each case is ``(class, completion, gold, math, math_verify, source)``: ``math`` is the label
of the final-answer profile (``math``, ``gsm8k`` and the MATH-style sources), ``math_verify``
the label of the profile that reproduces verl's ``math_verify`` scorer. The cases were written
for this file after reading the rules below (none is copied from their test suites); the
source names which rule gives each label:

``MATH-box``
    The MATH grader's ``last_boxed_only_string`` (hendrycks/math, also verl's
    ``reward_score/math.py``): the last ``\boxed``; ``\fbox`` only when there is no
    ``\boxed`` at all; ``\boxed 5`` (a space, no brace) reads to the next ``$``.
``MATH-strip``
    The MATH grader's ``strip_string`` before its exact comparison: ``\%`` is dropped (a
    percent is compared as the number written, never divided by 100), so are a unit after
    ``\text{ ``, ``^\circ``, ``\$``, ``\left``/``\right``, ``\!`` and spaces; ``\dfrac`` and
    ``\tfrac`` are ``\frac``; a short left side ``x = `` goes. A comma is never a decimal
    point, and a variable's name is part of the answer (``y > 2`` is not ``x > 2``).
``MV-num``, ``MV-latex``, ``MV-rel``, ``MV-sets``, ``MV-setrel``, ``MV-pct``
    What Math-Verify's own tests (tests/test_all.py) require of its equivalence: thousands
    separators (``,``, a space, ``,\!``), a currency or unit symbol next to a number
    (``1,000.99€``, ``12m²``), ``.4``; ``\frac13``, ``\sqrt3``, text units; flipped and
    negated inequalities are the same relation, ``k = 1`` is 1; open and closed interval
    ends differ, ``{1,3}`` equals ``(1,3)`` but not ``(3,1)``; ``x \in [a,b]`` as a
    prediction equals ``a \le x \le b`` but not the other way round (verl calls ``verify``
    without ``allow_set_relation_comp``); ``28\%`` equals 28, 0.28 does not equal 28.
``VERL-mv``
    verl's ``math_verify.compute_score``: ``\boxed{gold}`` against math-verify's ``parse``
    of the whole completion (expression and LaTeX targets: "final answer is" phrases,
    boxes, where boxes written one after another are joined into one set, then the last
    LaTeX span or number; no ``\fbox``, no ``\boxed {x}`` with a space before the brace,
    no ``<answer>`` tag).
``DIVRL-final``, ``DIVRL-hedge``, ``DIVRL-cut``, ``DIVRL-ineq``
    divrl's own documented rules (docs/rewards.md), where the official graders are silent
    or divrl is stricter on purpose: the final answer only (an answer tag or phrase when
    there is no box, no last-number fallback), hedged answers score 0 (uncertainty words,
    ``\approx``, alternatives, also inside ``\text{}``), a cut-off last box is no answer,
    an inequality in one variable equals its solution set.
"""

B = "MATH-box"
S = "MATH-strip"
V = "VERL-mv"

# (class, completion, gold, math, math_verify, source)
LABELLED = [
    # -- number extraction ---------------------------------------------------------------
    ("numbers", r"\boxed{7,425,000}", "7425000", 1, 1, "MV-num"),
    (
        "numbers",
        r"\boxed{1 000}",
        "1000",
        1,
        0,
        "MV-num; VERL-mv: a box holding 1 000 is a product",
    ),
    ("numbers", r"\boxed{.4}", "0.4", 1, 1, "MV-num"),
    ("numbers", r"\boxed{\$1,000.99}", "1000.99", 1, 1, "MV-num; MATH-strip drops \\$"),
    ("numbers", r"\boxed{11,\! 111,\! 111,\! 100}", "11111111100", 1, 1, "MV-num; MATH-strip"),
    ("numbers", r"\boxed{32,\! 349}", "32349", 1, 1, "MV-num"),
    ("numbers", r"\boxed{14{,}916}", "14916", 1, 1, "MV-num"),
    ("numbers", r"\boxed{3,000}", "3000", 1, 1, "MV-num"),
    ("numbers", r"\boxed{3.000}", "3", 1, 1, "MV-num: 1000.0 is 1000"),
    ("numbers", r"\boxed{3 \times 10^{3}}", "3000", 1, 1, "MV-latex"),
    ("numbers", r"\boxed{32, 349}", "32349", 0, 0, "MV-num: a comma and a space are two numbers"),
    ("numbers", r"\boxed{1,22}", "1.22", 0, 0, "MATH-strip; VERL-mv: in a box, two numbers"),
    ("numbers", r"\boxed{1000,99}", "1000.99", 0, 0, "MATH-strip; VERL-mv: in a box, two numbers"),
    ("numbers", r"\boxed{\$16,\!386.20}", "16386.2", 1, 1, "MV-num; MATH-strip"),
    ("numbers", r"\boxed{16386.17}", "16386.2", 0, 0, "MV-num: 6-digit rounding, not 1"),
    ("numbers", r"\boxed{125\textnormal{ miles}}", "125", 1, 1, "MV-latex: text units"),
    ("numbers", r"\boxed{15\mbox{ cm}^2}", "15", 1, 1, "MV-latex; MATH-strip units"),
    ("numbers", "The answer is 1,000.99€", "1000.99", 1, 1, "MV-num: currency after a number"),
    ("numbers", "The answer is €12.", "12", 1, 1, "MV-num: currency before a number"),
    ("numbers", "The answer is £1,200", "1200", 1, 1, "MV-num"),
    ("numbers", "The answer is 12m²", "12", 1, 1, "MV-num: 1,000.99m² is 1000.99"),
    ("numbers", "The answer is 12 m².", "12", 1, 1, "MV-num"),
    ("numbers", "The answer is 13 m².", "12", 0, 0, "MV-num"),
    ("numbers", "The answer is 1,000.99€", "100099", 0, 0, "MV-num"),
    (
        "numbers",
        "so the number is 10 which is 1,000.99m²",
        "1000.99",
        0,
        1,
        "DIVRL-final: no answer phrase or box; VERL-mv: last number",
    ),
    ("numbers", "Soucis : 2,74 $ a..", "2.74", 0, 1, "DIVRL-final; VERL-mv: MV-num decimal comma"),
    ("numbers", "1 000", "1000", 1, 1, "MV-num; DIVRL-final: a completion that is only a number"),
    ("numbers", "AZYUK2A", "2", 0, 0, "MV-num: a digit inside a word is no number"),
    ("numbers", r"\boxed{204_5}", "204_5", 1, 1, "MV-latex: base subscripts"),
    ("numbers", r"\boxed{1112112_3}", "204_5", 0, 0, "MV-latex: other base, other digits"),
    ("numbers", "The answer is 12 cm³.", "12", 1, 1, "MV-num: a unit symbol"),
    ("numbers", "The answer is 12x²", "12", 0, 1, "MATH-strip: 12x^2 is not 12; VERL-mv: 12"),
    ("numbers", "Answer: **42** cookies", "42", 1, 1, "DIVRL-final: bold markers go; MV-num"),
    ("numbers", "The answer is $42$ dollars.", "42", 1, 1, "MV-latex: 1/3 \\text{meters}"),
    ("numbers", "The answer is $43$ dollars.", "42", 0, 0, "MV-latex"),
    ("numbers", "The answer is 42!", "42", 0, 1, "MATH-strip: 42! is a factorial; VERL-mv: 42"),
    ("numbers", "The answer is 1 000.", "1000", 1, 1, "MV-num"),
    ("numbers", "The answer is 1e6", "1000000", 0, 0, "MV-num: no exponent notation read"),
    ("numbers", r"The final answer is 10^6", "1000000", 1, 1, "MV-latex"),
    # -- box variants --------------------------------------------------------------------
    ("box_variants", r"\fbox{3}", "3", 1, 0, "MATH-box: \\fbox without \\boxed; VERL-mv: not read"),
    ("box_variants", r"\fbox{4}", "3", 0, 0, B),
    (
        "box_variants",
        r"The answer is \fbox{\frac{1}{2}}.",
        "0.5",
        1,
        1,
        "MATH-box; VERL-mv: the phrase's LaTeX",
    ),
    (
        "box_variants",
        r"First \boxed{2}, then \fbox{3}.",
        "2",
        1,
        0,
        "MATH-box: \\boxed wins over \\fbox; VERL-mv: reads 2, 3 joined",
    ),
    ("box_variants", r"First \boxed{2}, then \fbox{3}.", "3", 0, 0, B),
    ("box_variants", r"\fbox{2} wait, \boxed{5}", "5", 1, 1, B),
    ("box_variants", r"\boxed {7}", "7", 1, 0, "MATH-box reads the brace; VERL-mv: not read"),
    ("box_variants", r"so $\boxed {7}$.", "7", 1, 1, "MATH-box; VERL-mv: the last LaTeX span"),
    ("box_variants", r"so $\boxed {8}$.", "7", 0, 0, B),
    ("box_variants", r"\boxed 7", "7", 1, 1, "MATH-box: \\boxed 7 to the next $"),
    ("box_variants", r"so \boxed 7$ is the count", "7", 1, 1, B),
    ("box_variants", r"so \boxed 8$ is the count", "7", 0, 0, B),
    (
        "box_variants",
        r"\boxed{2} then \boxed 3",
        "3",
        1,
        0,
        "MATH-box: the \\boxed form read last; VERL-mv reads 2",
    ),
    ("box_variants", r"$\boxed{\text{(C)}}$.", r"\text{C}", 1, 1, "MV-latex"),
    ("box_variants", r"$\boxed{\dfrac{3}{4}}$", "0.75", 1, 1, "MV-latex; MATH-strip \\dfrac"),
    (
        "box_variants",
        r"$\boxed{\left( 3, \frac{\pi}{2} \right)}$",
        r"(3, \frac{\pi}{2})",
        1,
        1,
        "MV-latex; MATH-strip \\left \\right",
    ),
    ("box_variants", r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", 1, 1, "MV-latex"),
    ("box_variants", r"\boxed{E}", r"\text{E}", 1, 1, "MV-latex: $\\text{E}$ equals $E$"),
    ("box_variants", r"\boxed{}", "0", 0, 0, "MATH-box: an empty answer; VERL-mv: nothing parsed"),
    ("box_variants", r"\fbox{$42$}", "42", 1, 1, "MATH-box; VERL-mv: the LaTeX span"),
    ("box_variants", r"\boxed{\textbf{(B)}}", "B", 1, 1, "MV-latex: (C) equals C"),
    ("box_variants", r"\boxed{\text{(B) } 42}", "B", 0, 0, "MATH-strip: (B)42 is not B"),
    ("box_variants", r"\(\boxed{42}\)", "42", 1, 1, "MATH-box; VERL-mv"),
    # -- multiple boxes ------------------------------------------------------------------
    (
        "multiple_boxes",
        r"\boxed{2} and \boxed{3}",
        "2, 3",
        0,
        1,
        "MATH-box: the last box is 3; VERL-mv: boxes joined",
    ),
    ("multiple_boxes", r"\boxed{2} and \boxed{3}", "3", 1, 0, "MATH-box; VERL-mv: {2, 3} is not 3"),
    ("multiple_boxes", r"\boxed{2}, \boxed{3}", "2", 0, 0, "MATH-box; VERL-mv"),
    ("multiple_boxes", r"\boxed{x=2} \boxed{x=3}", "3", 1, 0, "MATH-box; VERL-mv"),
    (
        "multiple_boxes",
        r"We had \boxed{\frac{1}{2}}; correcting, \boxed{\frac{1}{3}}",
        "1/3",
        1,
        0,
        "MATH-box: a self-correction; VERL-mv",
    ),
    (
        "multiple_boxes",
        r"$\boxed{(2,2)}$ and $\boxed{(6,2)}$",
        "(2,2),(6,2)",
        0,
        1,
        "MATH-box; VERL-mv: joined",
    ),
    ("multiple_boxes", r"$\boxed{(2,2), (6,2)}$", "(2,2),(6,2)", 1, 1, "MV-sets"),
    ("multiple_boxes", r"Check: \boxed{4}. Done: $\boxed{4}$", "4", 1, 1, "MATH-box; VERL-mv"),
    (
        "multiple_boxes",
        r"\boxed{4} then the final \boxed{5",
        "4",
        0,
        1,
        "DIVRL-cut: a cut-off last box; VERL-mv: the earlier box",
    ),
    ("multiple_boxes", r"\boxed{12\text{ and }13}", "12, 13", 1, 1, "MV-latex: 12 and 13 is a set"),
    ("multiple_boxes", r"\boxed{12\text{ and }13}", "12", 0, 0, "MV-latex"),
    # -- sets and relations --------------------------------------------------------------
    (
        "sets_relations",
        r"$\boxed{x \in \{1,2\}}$",
        r"\{1,2\}",
        1,
        1,
        "MV-setrel: x \\in S as a prediction is S",
    ),
    ("sets_relations", r"$\boxed{x \in \{1, 2\}}$", "1, 2", 1, 1, "MV-setrel; MV-sets"),
    ("sets_relations", r"$\boxed{x \in \{1,2\}}$", r"\{1,2,3\}", 0, 0, "MV-sets"),
    ("sets_relations", r"$\boxed{\{1,2\}}$", r"x \in \{1,2\}", 1, 1, "MV-setrel"),
    ("sets_relations", r"\boxed{\{1,2\}}", "1,2", 1, 1, "MV-sets"),
    ("sets_relations", r"${1,3}$", "(1,3)", 1, 1, "MV-sets: {1,3} equals (1,3)"),
    ("sets_relations", r"$\boxed{\{3,1\}}$", "(3,1)", 1, 1, "MV-sets"),
    ("sets_relations", r"$\boxed{\{1,3\}}$", "(3,1)", 0, 0, "MV-sets: {1,3} does not equal (3,1)"),
    ("sets_relations", r"\boxed{a < b}", "b > a", 1, 1, "MV-rel: a flipped relation"),
    ("sets_relations", r"\boxed{b > a}", "a < b", 1, 1, "MV-rel"),
    ("sets_relations", r"\boxed{5 \geq x}", r"x \leq 5", 1, 1, "MV-rel"),
    ("sets_relations", r"\boxed{x \geq 5}", r"x \leq 5", 0, 0, "MV-rel"),
    ("sets_relations", r"\boxed{-x > -1}", "x < 1", 1, 1, "MV-rel: a negated relation"),
    ("sets_relations", r"\boxed{x > -1}", "x < 1", 0, 0, "MV-rel"),
    ("sets_relations", r"\boxed{x \neq 3}", "x != 3", 1, 1, "MV-rel"),
    ("sets_relations", r"\boxed{y > 2}", "x > 2", 0, 0, "MATH-strip; MV-rel: another variable"),
    (
        "sets_relations",
        r"\boxed{y \le 2}",
        r"(-\infty, 2]",
        1,
        0,
        "DIVRL-ineq: one variable, its solution set; VERL-mv",
    ),
    ("sets_relations", r"\boxed{k = 1}", "1", 1, 1, "MV-rel; MATH-strip x ="),
    ("sets_relations", r"\boxed{x = 1, 2}", "1, 2", 1, 1, "MV-rel"),
    ("sets_relations", r"\boxed{y=-\frac{1}{2}x+\frac{3}{4}}", "2x+4y-3=0", 1, 1, "MV-rel"),
    ("sets_relations", r"\boxed{f(2) < f(1) < f(4)}", "f(2) < f(1) < f(4)", 1, 1, "MV-latex"),
    ("sets_relations", r"\boxed{1 \pm \sqrt{19}}", r"1 \pm \sqrt{19}", 1, 1, "MV-latex"),
    ("sets_relations", r"\boxed{x \ge 5}", r"y \ge 5", 0, 0, "MATH-strip; MV-rel"),
    (
        "sets_relations",
        r"\boxed{x<2 \text{ or } y>3}",
        r"(-\infty,2)\cup(3,\infty)",
        0,
        0,
        "DIVRL-ineq: two variables are no solution set",
    ),
    ("sets_relations", r"\boxed{1 < y < 3}", "(1,3)", 1, 0, "DIVRL-ineq; VERL-mv"),
    # -- intervals -----------------------------------------------------------------------
    ("intervals", r"$\boxed{[0,1)}$", "[0,1)", 1, 1, "MV-sets"),
    ("intervals", r"$\boxed{[0,1)}$", "[0,9)", 0, 0, "MV-sets"),
    ("intervals", r"$\boxed{[0,9)}$", "(0,9)", 0, 0, "MV-sets: open and closed ends differ"),
    ("intervals", r"\boxed{(0, 9)}", "[0, 9)", 0, 0, "MV-sets"),
    ("intervals", r"\boxed{x \in [-2,7]}", r"-2 \le x \le 7", 1, 1, "MV-setrel"),
    (
        "intervals",
        r"\boxed{-2 \le x \le 7}",
        r"x \in [-2,7]",
        1,
        0,
        "DIVRL-ineq; MV-setrel: not without allow_set_relation_comp",
    ),
    ("intervals", r"\boxed{-2 \le x \le 7}", "[-2,7]", 1, 0, "DIVRL-ineq; VERL-mv"),
    ("intervals", r"\boxed{x \in (-6, 10)}", "(-6,10)", 1, 1, "MV-setrel"),
    ("intervals", r"\boxed{(-6, 10)}", r"x \in (-6,10)", 1, 1, "MV-setrel"),
    (
        "intervals",
        r"$\boxed{x \in (2,12) \cup (12,102)}$",
        r"(2, 12) \cup (12, 102)",
        1,
        1,
        "MV-setrel",
    ),
    (
        "intervals",
        r"\boxed{[-1, -\tfrac12) \cup (-\tfrac12, 0)}",
        r"[-1, -\frac{1}{2}) \cup (-\frac{1}{2}, 0)",
        1,
        1,
        "MV-latex",
    ),
    ("intervals", r"\boxed{[2,5) \cup \{7\}}", r"[2,5)\cup\{7\}", 1, 1, "MV-sets"),
    ("intervals", r"\boxed{x \in [2, 5]}", "[2,5)", 0, 0, "MV-sets"),
    ("intervals", r"\boxed{(-\infty, 0) \cup (0, \infty)}", r"x \neq 0", 1, 1, "MV-setrel"),
    ("intervals", r"\boxed{1 < x}", r"(1, \infty)", 1, 0, "DIVRL-ineq; VERL-mv"),
    ("intervals", r"\boxed{1 \le x}", r"(1, \infty)", 0, 0, "DIVRL-ineq: a closed end"),
    ("intervals", r"\boxed{x > 5}", r"[5, \infty)", 0, 0, "DIVRL-ineq"),
    ("intervals", r"\boxed{[5, \infty)}", r"x \ge 5", 1, 1, "MV-setrel"),
    ("intervals", r"\boxed{(5, \infty)}", r"x \ge 5", 0, 0, "MV-setrel"),
    # -- percentages ---------------------------------------------------------------------
    (
        "percentages",
        r"\boxed{50\%}",
        "0.5",
        0,
        1,
        "MATH-strip: 50 is not 0.5; VERL-mv: math-verify reads 50\\% as 1/2",
    ),
    ("percentages", r"\boxed{0.5}", r"50\%", 0, 1, "MATH-strip; VERL-mv"),
    ("percentages", r"\boxed{\frac{1}{2}}", r"50\%", 0, 1, "MATH-strip; VERL-mv"),
    ("percentages", r"\boxed{100\%}", "1", 0, 1, "MATH-strip; VERL-mv"),
    ("percentages", r"\boxed{12.5\%}", r"\frac{1}{8}", 0, 1, "MATH-strip; VERL-mv"),
    ("percentages", "The answer is 35%.", "0.35", 0, 1, "MATH-strip; VERL-mv"),
    ("percentages", r"\boxed{50\%}", "50", 1, 1, "MATH-strip; MV-pct"),
    ("percentages", r"\boxed{50}", r"50\%", 1, 1, "MATH-strip; MV-pct: 28 equals 28\\%"),
    ("percentages", r"\boxed{50 \text{ percent}}", r"50\%", 1, 1, "MV-pct: 28 percent"),
    ("percentages", r"\boxed{28 pct}", r"28\%", 1, 1, "MV-pct: 28 pct"),
    ("percentages", r"$\boxed{20}$ percent", r"20\%", 1, 1, "MV-pct; MATH-box"),
    ("percentages", "The answer is 35%.", "35", 1, 1, "MATH-strip; MV-pct"),
    ("percentages", r"\boxed{1.5\%}", "1.5", 1, 0, "MATH-strip; VERL-mv: 1.5\\% is 0.015"),
    ("percentages", r"\boxed{28\%}", "0.28", 0, 1, "MATH-strip; VERL-mv"),
    ("percentages", "28", "0.28", 0, 0, "MV-pct: 0.28 is not 28"),
    ("percentages", r"\boxed{28}", r"\frac{28}{100}", 0, 0, "MV-pct"),
    ("percentages", r"\boxed{51\%}", r"50\%", 0, 0, "MATH-strip"),
    ("percentages", "The answer is 5 percent.", "0.05", 0, 1, "MATH-strip; VERL-mv"),
    ("percentages", "The answer is 5 percent.", "5", 1, 1, "MV-pct"),
    ("percentages", r"\boxed{0.05}", r"5\%", 0, 1, "MATH-strip; VERL-mv"),
    # -- hedges (divrl's rule; math-verify scores what it reads) ---------------------------
    (
        "hedges",
        r"\boxed{7\text{ (or 3)}}",
        "7",
        0,
        1,
        "DIVRL-hedge; VERL-mv: the unit text dropped",
    ),
    ("hedges", r"\boxed{7 \text{ or 3}}", "7", 0, 1, "DIVRL-hedge; VERL-mv"),
    ("hedges", r"\boxed{7 \text{ (alternatively 3)}}", "7", 0, 1, "DIVRL-hedge; VERL-mv"),
    ("hedges", r"<answer>7 \text{ (or 3)}</answer>", "7", 0, 0, "DIVRL-hedge; VERL-mv: reads 3"),
    ("hedges", r"\boxed{7 \text{ or } 3}", "7", 0, 0, "DIVRL-hedge; VERL-mv: the set {7, 3}"),
    ("hedges", r"\boxed{7 (or 3)}", "7", 0, 0, "DIVRL-hedge; VERL-mv"),
    ("hedges", r"\boxed{7 \text{ (or 3)}}", "7, 3", 1, 0, "DIVRL-hedge: the set itself; VERL-mv"),
    ("hedges", r"$x\approx11$", "11", 0, 1, "DIVRL-hedge; MV-rel: x \\approx 11 equals 11"),
    ("hedges", r"\boxed{\approx 2.5}", "2.5", 0, 1, "DIVRL-hedge; VERL-mv"),
    ("hedges", "The answer is probably 42.", "42", 0, 1, "DIVRL-hedge; VERL-mv"),
    ("hedges", "It is either 7 or 8.", "8", 0, 1, "DIVRL-final; VERL-mv: the last number"),
    ("hedges", r"\boxed{\approxeq 3}", "3", 0, 1, "DIVRL-hedge; VERL-mv"),
    ("hedges", r"\boxed{3 \sim 4}", "3", 0, 0, "DIVRL-hedge; VERL-mv"),
    ("hedges", r"\boxed{7\text{ cm}}", "7", 1, 1, "MV-latex: text units"),
    ("hedges", r"\boxed{7 \text{ cm}^2}", "7", 1, 1, "MV-latex"),
]

CLASSES = sorted({case[0] for case in LABELLED})
