"""Generate the small fixture set shipped in ``divrl/data/fixtures`` (deterministic, offline).

Writes:
  math.jsonl              math problems, verl schema (chat prompt, reward_model.ground_truth)
  math_flat.jsonl         the same problems in the flat form (question, answer)
  math_completions.jsonl  sample completions for ``divrl score`` (right, wrong, unanswered)
  sql.jsonl               text-to-SQL questions, verl schema, extra_info.db_path relative
  sql_completions.jsonl   sample completions, including write attempts that must score 0
  databases/*.sqlite      three small SQLite databases

Usage: python scripts/make_fixtures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "divrl" / "data" / "fixtures"

MATH_INSTRUCTION = "Solve the problem. Put the final answer in \\boxed{}."

# (question, ground truth, a correct completion's final answer, a wrong one)
MATH_PROBLEMS = [
    ("What is 37 + 48?", "85", "85", "75"),
    ("A train travels 120 km in 1.5 hours. What is its average speed in km/h?", "80", "80", "180"),
    ("Simplify the fraction 18/24.", "\\frac{3}{4}", "0.75", "\\frac{2}{3}"),
    ("What is 2.5 times 0.4?", "1", "1.0", "10"),
    ("Solve for x: 3x - 7 = 11.", "6", "x = 6", "4"),
    (
        "What is the positive square root of 50, in simplest radical form?",
        "5\\sqrt{2}",
        "5\\sqrt{2}",
        "25\\sqrt{2}",
    ),
    ("Find all real solutions of x^2 - 5x + 6 = 0.", "\\{2, 3\\}", "\\{3, 2\\}", "\\{1, 6\\}"),
    ("For which real x is x^2 < 4? Give an interval.", "(-2, 2)", "(-2,2)", "[-2, 2]"),
    ("What is 15% of 240?", "36", "36", "3600"),
    ("How many positive divisors does 36 have?", "9", "9", "8"),
    ("What is the sum of the interior angles of a hexagon, in degrees?", "720", "720", "1080"),
    ("Evaluate 1/2 + 1/3.", "\\frac{5}{6}", "\\dfrac{5}{6}", "\\frac{2}{5}"),
]

DATABASES = {
    "shop": [
        "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT)",
        "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price REAL)",
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES "
        "customers(id), product_id INTEGER REFERENCES products(id), quantity INTEGER)",
    ],
    "school": [
        "CREATE TABLE students (id INTEGER PRIMARY KEY, name TEXT NOT NULL, year INTEGER)",
        "CREATE TABLE courses (id INTEGER PRIMARY KEY, title TEXT NOT NULL, credits INTEGER)",
        "CREATE TABLE enrollments (student_id INTEGER REFERENCES students(id), course_id "
        "INTEGER REFERENCES courses(id), grade INTEGER)",
    ],
    "flights": [
        "CREATE TABLE airports (code TEXT PRIMARY KEY, city TEXT NOT NULL, country TEXT)",
        "CREATE TABLE flights (id INTEGER PRIMARY KEY, origin TEXT REFERENCES airports(code), "
        "destination TEXT REFERENCES airports(code), distance INTEGER, price REAL)",
    ],
}

CITIES = ["Paris", "Lyon", "Berlin", "Madrid", "Rome", "Oslo"]
NAMES = ["Ada", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivo", "Jana", "Kai", "Lea"]

# (db, question, gold query, a wrong query)
SQL_QUESTIONS = [
    (
        "shop",
        "How many customers are there?",
        "SELECT COUNT(*) FROM customers",
        "SELECT COUNT(*) FROM orders",
    ),
    (
        "shop",
        "List the names of customers who live in Paris.",
        "SELECT name FROM customers WHERE city = 'Paris'",
        "SELECT name FROM customers WHERE city = 'Lyon'",
    ),
    (
        "shop",
        "What is the total quantity ordered of each product? Give product name and total, "
        "ordered by total descending then name.",
        "SELECT p.name, SUM(o.quantity) AS total FROM orders o JOIN products p ON p.id = "
        "o.product_id GROUP BY p.id ORDER BY total DESC, p.name",
        "SELECT p.name, SUM(o.quantity) AS total FROM orders o JOIN products p ON p.id = "
        "o.product_id GROUP BY p.id ORDER BY total ASC, p.name",
    ),
    (
        "shop",
        "What is the price of the most expensive product?",
        "SELECT MAX(price) FROM products",
        "SELECT MIN(price) FROM products",
    ),
    (
        "school",
        "How many students are in year 2?",
        "SELECT COUNT(*) FROM students WHERE year = 2",
        "SELECT COUNT(*) FROM students WHERE year = 3",
    ),
    (
        "school",
        "What is the average grade in each course? Give course title and average.",
        "SELECT c.title, AVG(e.grade) FROM enrollments e JOIN courses c ON c.id = e.course_id "
        "GROUP BY c.id",
        "SELECT c.title, MAX(e.grade) FROM enrollments e JOIN courses c ON c.id = e.course_id "
        "GROUP BY c.id",
    ),
    (
        "school",
        "Which students are not enrolled in any course?",
        "SELECT name FROM students WHERE id NOT IN (SELECT student_id FROM enrollments)",
        "SELECT name FROM students WHERE id IN (SELECT student_id FROM enrollments)",
    ),
    (
        "flights",
        "How many flights depart from Paris airports?",
        "SELECT COUNT(*) FROM flights f JOIN airports a ON a.code = f.origin WHERE a.city = 'Paris'",
        "SELECT COUNT(*) FROM flights f JOIN airports a ON a.code = f.destination WHERE a.city = "
        "'Paris'",
    ),
    (
        "flights",
        "What is the longest flight distance?",
        "SELECT MAX(distance) FROM flights",
        "SELECT AVG(distance) FROM flights",
    ),
    (
        "flights",
        "List the codes of airports in Germany, alphabetically.",
        "SELECT code FROM airports WHERE country = 'Germany' ORDER BY code",
        "SELECT code FROM airports WHERE country = 'Germany' ORDER BY code DESC",
    ),
]


def build_databases(out: Path) -> dict[str, str]:
    """Create the SQLite files; returns db name -> CREATE statements (for the prompts)."""
    rng = random.Random(0)
    db_dir = out / "databases"
    db_dir.mkdir(parents=True, exist_ok=True)
    for name, ddl in DATABASES.items():
        path = db_dir / f"{name}.sqlite"
        path.unlink(missing_ok=True)
        conn = sqlite3.connect(path)
        for stmt in ddl:
            conn.execute(stmt)
        if name == "shop":
            conn.executemany(
                "INSERT INTO customers VALUES (?, ?, ?)",
                [(i + 1, n, rng.choice(CITIES)) for i, n in enumerate(NAMES)],
            )
            products = ["pen", "book", "lamp", "mug", "desk", "chair"]
            conn.executemany(
                "INSERT INTO products VALUES (?, ?, ?)",
                [(i + 1, p, round(rng.uniform(2, 200), 2)) for i, p in enumerate(products)],
            )
            conn.executemany(
                "INSERT INTO orders VALUES (?, ?, ?, ?)",
                [
                    (i + 1, rng.randint(1, len(NAMES)), rng.randint(1, 6), rng.randint(1, 5))
                    for i in range(40)
                ],
            )
        elif name == "school":
            conn.executemany(
                "INSERT INTO students VALUES (?, ?, ?)",
                [(i + 1, n, rng.randint(1, 3)) for i, n in enumerate(NAMES)],
            )
            courses = ["Algebra", "Biology", "Chemistry", "Drawing"]
            conn.executemany(
                "INSERT INTO courses VALUES (?, ?, ?)",
                [(i + 1, c, rng.choice([3, 4, 6])) for i, c in enumerate(courses)],
            )
            pairs = sorted({(rng.randint(1, 9), rng.randint(1, 4)) for _ in range(20)})
            conn.executemany(
                "INSERT INTO enrollments VALUES (?, ?, ?)",
                [(s, c, rng.randint(50, 100)) for s, c in pairs],
            )
        else:
            airports = [
                ("CDG", "Paris", "France"),
                ("ORY", "Paris", "France"),
                ("LYS", "Lyon", "France"),
                ("BER", "Berlin", "Germany"),
                ("MUC", "Munich", "Germany"),
                ("MAD", "Madrid", "Spain"),
            ]
            conn.executemany("INSERT INTO airports VALUES (?, ?, ?)", airports)
            codes = [a[0] for a in airports]
            flights = []
            for i in range(30):
                o, d = rng.sample(codes, 2)
                flights.append(
                    (i + 1, o, d, rng.randint(300, 1800), round(rng.uniform(40, 400), 2))
                )
            conn.executemany("INSERT INTO flights VALUES (?, ?, ?, ?, ?)", flights)
        conn.commit()
        conn.execute("VACUUM")
        conn.close()
    return {name: ";\n".join(ddl) + ";" for name, ddl in DATABASES.items()}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def build_math(out: Path) -> None:
    rows, flat, completions = [], [], []
    for i, (question, gold, right, wrong) in enumerate(MATH_PROBLEMS):
        rows.append(
            {
                "data_source": "math",
                "prompt": [{"role": "user", "content": f"{question}\n{MATH_INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": gold},
                "extra_info": {"index": f"math-{i}", "split": "test"},
            }
        )
        flat.append({"id": f"math-{i}", "question": question, "answer": gold})
        completions.append(
            {
                "id": f"math-{i}",
                "completions": [
                    f"Working it out step by step, the answer is \\boxed{{{right}}}.",
                    f"I think the result is \\boxed{{{wrong}}}.",
                    "I am not sure how to solve this.",
                ],
            }
        )
    write_jsonl(out / "math.jsonl", rows)
    write_jsonl(out / "math_flat.jsonl", flat)
    write_jsonl(out / "math_completions.jsonl", completions)


def build_sql(out: Path, schemas: dict[str, str]) -> None:
    rows, completions = [], []
    for i, (db, question, gold, wrong) in enumerate(SQL_QUESTIONS):
        conn = sqlite3.connect(out / "databases" / f"{db}.sqlite")
        gold_rows, wrong_rows = conn.execute(gold).fetchall(), conn.execute(wrong).fetchall()
        conn.close()
        # the sample "wrong" query must really differ, or the fixture would mislead tests
        ordered = "ORDER BY" in gold
        same = gold_rows == wrong_rows if ordered else sorted(gold_rows) == sorted(wrong_rows)
        if not gold_rows or same:
            raise SystemExit(f"SQL fixture {i}: gold and wrong queries agree: {gold_rows}")
        prompt = (
            f"Database schema:\n{schemas[db]}\n\nQuestion: {question}\n"
            "Answer with one SQLite query in a ```sql block."
        )
        rows.append(
            {
                "data_source": "sql",
                "prompt": prompt,
                "ability": "sql",
                "reward_model": {"style": "rule", "ground_truth": gold},
                "extra_info": {
                    "index": f"sql-{i}",
                    "db_id": db,
                    "db_path": f"databases/{db}.sqlite",
                },
            }
        )
        completions.append(
            {
                "id": f"sql-{i}",
                "completions": [
                    f"```sql\n{gold};\n```",
                    wrong,
                    f"```sql\nDROP TABLE {DATABASES[db][0].split()[2]};\n```",
                    "SELECT no_such_column FROM nowhere",
                ],
            }
        )
    write_jsonl(out / "sql.jsonl", rows)
    write_jsonl(out / "sql_completions.jsonl", completions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    schemas = build_databases(args.out)
    build_math(args.out)
    build_sql(args.out, schemas)
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote fixtures to {args.out} ({total / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
