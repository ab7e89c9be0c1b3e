"""THE MATH: pure functions of tensors and masks, each citing its paper. Imports torch only.

masked      masked sums, means, variances, whitening, explained variance
kl          per-token KL estimators, adaptive and fixed KL controllers
scores      score normalisation, reward shaping, score statistics
advantages  generalised advantage estimation
losses      the clipped PPO losses, Bradley-Terry and response NLL
"""
