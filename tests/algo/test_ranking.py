"""algo/ranking.py on hand numbers: layers ranked by gain, Spearman's rho with and without ties,
the best window of consecutive layers."""

import math

import pytest

from hydrappo.algo.ranking import average_ranks, best_window, rank_layers, spearman_rho


def test_layers_rank_by_gain_and_equal_gains_in_layer_order():
    assert rank_layers({3: 0.1, 1: 0.2, 2: 0.1, 4: -0.3}) == [1, 2, 3, 4]


def test_average_ranks_share_a_tie():
    assert average_ranks([0.3, 0.1, 0.3]) == [2.5, 1.0, 2.5]
    assert average_ranks([5.0, 5.0, 5.0, 1.0]) == [3.0, 3.0, 3.0, 1.0]


def test_spearman_without_ties_is_the_textbook_formula():
    # ranks 1 4 2 3 against 2 3 1 4: d = -1 1 1 -1, 1 - 6 * 4 / (4 * 15) = 0.6
    assert spearman_rho([0.1, 0.4, 0.2, 0.3], [0.2, 0.3, 0.1, 0.4]) == pytest.approx(0.6)
    assert spearman_rho([1, 2, 3, 4, 5], [10, 20, 30, 40, 50]) == pytest.approx(1.0)
    assert spearman_rho([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]) == pytest.approx(-1.0)
    # only the order counts: any increasing transform keeps rho at 1
    assert spearman_rho([0.01, 0.02, 0.5], [1.0, 100.0, 101.0]) == pytest.approx(1.0)


def test_spearman_with_ties_is_pearson_of_average_ranks():
    # ranks 1 2.5 2.5 4 against 1 2 3 4: covariance 4.5, spreads 4.5 and 5 -> sqrt(0.9)
    assert spearman_rho([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(math.sqrt(0.9))


def test_spearman_is_undefined_where_nothing_is_ordered():
    assert math.isnan(spearman_rho([0.0, 0.0, 0.0], [1.0, 2.0, 3.0]))
    assert math.isnan(spearman_rho([1.0], [2.0]))
    with pytest.raises(ValueError, match="one pair per item"):
        spearman_rho([1, 2], [1, 2, 3])


GAINS = {1: 0.125, 2: 0.5, 3: 0.25, 4: -0.25, 5: 0.5, 6: 0.25}  # exact in binary: the sums tie exactly


def test_the_best_window_sums_the_most_gain():
    assert best_window(GAINS, 3) == (1, 4, 0.875)
    assert best_window(GAINS, 1) == (5, 6, 0.5)  # layers 2 and 5 tie: the higher
    assert best_window(GAINS, 6) == (1, 7, 1.375)


def test_equal_windows_go_to_the_higher_one():
    # 2:4 and 5:7 both sum 0.75; the higher band backpropagates through fewer layers
    assert best_window(GAINS, 2) == (5, 7, 0.75)


def test_a_window_needs_every_layer_measured():
    gains = {1: 0.5, 2: 0.25, 4: 1.0}
    assert best_window(gains, 2) == (1, 3, 0.75)  # 3:5 lacks layer 3
    with pytest.raises(ValueError, match="no 3 consecutive layers"):
        best_window(gains, 3)
    with pytest.raises(ValueError, match="1 or more"):
        best_window(gains, 0)
