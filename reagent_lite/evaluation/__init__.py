"""Counterfactual policy evaluation (CPE) from logged data: pure numpy estimators.

`one_step_estimates` (Direct Method, IPS, SNIPS, Doubly Robust) and `sequential_estimates`
(sequential DR, weighted DR, MAGIC), each returning `CpeEstimate`s normalised by the logged
policy's value, with bootstrap standard errors.
"""

from reagent_lite.evaluation.cpe import CpeEstimate, masked_distribution, one_step_estimates
from reagent_lite.evaluation.sequential import sequential_estimates

__all__ = ["CpeEstimate", "masked_distribution", "one_step_estimates", "sequential_estimates"]
