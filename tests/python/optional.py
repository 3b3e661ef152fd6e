"""Which optional libraries the Python tests can compare against (one helper for every test file)."""


def has(mod):
    """True when `mod` imports (a reference library may be missing on a machine)."""
    try:
        __import__(mod)
        return True
    except Exception:  # noqa: BLE001
        return False
