"""One module per scenario, each with `run(work_dir, report)`."""


def alternate(ours, reference, runs: int, warmup: int) -> tuple[list[float], list[float]]:
    """Samples of `ours()` and of `reference()` (each answers its seconds): `warmup` of
    each first, then `runs` of each in turn, so that both meet the same machine state."""
    for _ in range(warmup):
        ours()
        reference()
    ours_samples, reference_samples = [], []
    for _ in range(runs):
        ours_samples.append(ours())
        reference_samples.append(reference())
    return ours_samples, reference_samples
