"""Random (start, stop, step) selections, the form the format readers take."""


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
