"""Every generated fixture in tests/ and benchmarks/ is seeded: the same bytes on every run.

A fixture drawn from an unseeded generator (Pillow's Image.effect_noise, numpy's global
np.random.*, the random module's shared instance) made a test pass or fail by luck.
"""

import pathlib
import re

from tests.helpers import REPO, noise_image

UNSEEDED = re.compile(
    r"effect_noise\("                                   # Pillow: no seed at all
    r"|np\.random\.(?!default_rng\b|Generator\b|RandomState\b)\w+\("  # numpy's global state
    r"|(?<![\w.])random\.(?!Random\b|SystemRandom\b)[a-z_]+\(")       # random's shared one


def test_noise_image_is_the_same_on_every_call():
    a, b = noise_image((64, 64), 60), noise_image((64, 64), 60)
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != noise_image((64, 64), 60, seed=1).tobytes()
    assert 100 < sum(a.tobytes()) / len(a.tobytes()) < 156  # around 128, like effect_noise


def test_no_unseeded_generator_in_tests_or_benchmarks():
    offenders = []
    for folder in ("tests", "benchmarks"):
        for path in sorted(pathlib.Path(REPO, folder).glob("*.py")):
            if path.name == pathlib.Path(__file__).name:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if UNSEEDED.search(code):
                    offenders.append(f"{folder}/{path.name}:{n}: {line.strip()}")
    assert not offenders, "unseeded generators:\n" + "\n".join(offenders)
