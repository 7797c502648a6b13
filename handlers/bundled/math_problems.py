"""Twenty short math problems with answers, and the Python that computes each answer."""

from __future__ import annotations

# (problem, answer as LaTeX, python code whose last expression is the answer, a wrong answer)
PROBLEMS: list[tuple[str, str, str, str]] = [
    ("What is 17 * 23?", "391", "17 * 23", "381"),
    ("Compute 2^10 + 2^5.", "1056", "2**10 + 2**5", "1024"),
    ("What is the sum of the first 100 positive integers?", "5050", "sum(range(1, 101))", "5000"),
    ("Write 6/8 as a fraction in lowest terms.", "\\frac{3}{4}", "from fractions import Fraction\nFraction(6, 8)", "\\frac{2}{3}"),
    ("Solve 3x + 7 = 22 for x.", "5", "import sympy as sp\nx = sp.symbols('x')\nsp.solve(3*x + 7 - 22, x)[0]", "4"),
    ("In how many ways can 3 items be chosen from 10?", "120", "import math\nmath.comb(10, 3)", "720"),
    ("What is the length of the diagonal of a square with side 2?", "2\\sqrt{2}", "import sympy as sp\nsp.sqrt(2**2 + 2**2)", "4"),
    ("What is the greatest common divisor of 84 and 126?", "42", "import math\nmath.gcd(84, 126)", "21"),
    ("What is the least common multiple of 12 and 18?", "36", "import math\nmath.lcm(12, 18)", "216"),
    ("What is the remainder when 2^20 is divided by 7?", "4", "pow(2, 20, 7)", "1"),
    ("What is the sum of the roots of x^2 - 5x + 6 = 0?", "5", "import sympy as sp\nx = sp.symbols('x')\nsum(sp.solve(x**2 - 5*x + 6, x))", "6"),
    ("How many positive divisors does 360 have?", "24", "sum(1 for d in range(1, 361) if 360 % d == 0)", "20"),
    ("Two fair dice are rolled. What is the probability that their sum is 7?", "\\frac{1}{6}", "from fractions import Fraction\nFraction(sum(1 for a in range(1, 7) for b in range(1, 7) if a + b == 7), 36)", "\\frac{1}{12}"),
    ("What is 1/2 + 1/3 + 1/6?", "1", "from fractions import Fraction\nFraction(1, 2) + Fraction(1, 3) + Fraction(1, 6)", "\\frac{5}{6}"),
    ("What is the area of a triangle with sides 3, 4 and 5?", "6", "3 * 4 / 2", "12"),
    ("What is 7!/5!?", "42", "import math\nmath.factorial(7) // math.factorial(5)", "35"),
    ("What is the smallest prime number greater than 100?", "101", "import sympy as sp\nsp.nextprime(100)", "103"),
    ("What is the sum of the interior angles of a hexagon, in degrees?", "720", "(6 - 2) * 180", "360"),
    ("What is the derivative of x^3 at x = 2?", "12", "import sympy as sp\nx = sp.symbols('x')\nsp.diff(x**3, x).subs(x, 2)", "8"),
    ("What is the integral of 2x from 0 to 3?", "9", "import sympy as sp\nx = sp.symbols('x')\nsp.integrate(2*x, (x, 0, 3))", "6"),
]
