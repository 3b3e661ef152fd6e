"""Random (start, stop, step) selections, the form the format readers take."""
import random


def random_selection(rng, shape, steps=(1, 1, 2, 3, 7)):
    """One (start, stop, step) per dimension; possibly empty; rng is a random.Random."""
    sel = []
    for n in shape:
        if n == 0:
            sel.append((0, 0, 1))
            continue
        start = rng.randrange(0, n)
        sel.append((start, rng.randrange(start, n + 1), rng.choice(steps)))
    return sel


def nonempty_selections(shape, n, seed, steps=(1, 1, 1, 2, 3, 7)):
    """n random selections of shape, none of them empty (every dimension > 0)."""
    rng = random.Random(seed)
    for _ in range(n):
        sel = []
        for s in shape:
            start = rng.randrange(0, s)
            sel.append((start, rng.randrange(start + 1, s + 1), rng.choice(steps)))
        yield sel
