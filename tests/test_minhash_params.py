"""The LSH band/row choice without verification is datasketch.MinHashLSH's, computed by our own closed
form (stages.minhash.lsh_optimum). datasketch's private `_optimal_param` and integrals are imported
here on purpose: this file is the pin that says when a datasketch release chooses differently."""
from __future__ import annotations

import numpy as np
import pytest
from datasketch.lsh import _false_negative_probability, _false_positive_probability, _optimal_param

from corpusmill.stages.minhash import lsh_error_areas, lsh_optimum, optimal_bands

THRESHOLDS = (0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.333, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99, 1.0)
WEIGHTS = ((0.5, 0.5), (0.1, 0.9), (0.9, 0.1), (0.3, 0.7))


@pytest.mark.parametrize("num_perm", [1, 2, 3, 5, 8, 13, 32, 64])
def test_our_band_choice_equals_datasketchs_for_every_threshold_and_weighting(num_perm):
    # t = 0.5 with 2 or 3 permutations holds exact ties (1x1, 1x2 and 2x1 all weigh 1/8): the first wins
    for t in THRESHOLDS:
        for fp_w, fn_w in WEIGHTS:
            assert lsh_optimum(t, num_perm, fp_w, fn_w) == _optimal_param(t, num_perm, fp_w, fn_w), (t, num_perm, fp_w)


def test_our_band_choice_equals_datasketchs_for_large_signatures():
    # (datasketch takes ~0.1 s at 128 permutations and seconds at 4096; the change was checked against it on
    # 7,949 (threshold, num_perm) points up to 4096 permutations, none differing)
    for num_perm in (128, 256):
        for t in (0.05, 0.5, 0.8, 0.95):
            assert lsh_optimum(t, num_perm) == _optimal_param(t, num_perm, 0.5, 0.5), (t, num_perm)


@pytest.mark.parametrize("t,num_perm", [(0.8, 128), (0.5, 64), (0.01, 300), (0.001, 200), (0.99, 256), (1.0, 16)])
def test_error_areas_equal_datasketchs_integrals(t, num_perm):
    b, r, fp, fn = lsh_error_areas(t, num_perm)
    assert len(b) == sum(num_perm // k for k in range(1, num_perm + 1)) and (b * r <= num_perm).all()
    # every pair with few bands (where t^r underflows for small t) and a spread of the rest
    picks = np.unique(np.r_[np.arange(min(len(b), 150)), np.linspace(0, len(b) - 1, 60).astype(int)])
    for i in picks:
        assert fp[i] == pytest.approx(_false_positive_probability(t, b[i], r[i]), abs=1e-12), (b[i], r[i])
        assert fn[i] == pytest.approx(_false_negative_probability(t, b[i], r[i]), abs=1e-12), (b[i], r[i])


def test_optimal_bands_without_verification_is_datasketchs_equal_weighting():
    for t, num_perm in ((0.8, 128), (0.7, 256), (0.9, 64), (0.5, 100)):
        assert optimal_bands(t, num_perm, verify=False) == _optimal_param(t, num_perm, 0.5, 0.5)
    # the project's default (threshold 0.8, 128 permutations), as it was before datasketch left the code path
    assert optimal_bands(0.8, 128, verify=False) == (9, 13)
