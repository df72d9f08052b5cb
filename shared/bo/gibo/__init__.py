"""DP-GIBO: differentially private gradient-informative Bayesian optimisation, pure numerics.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Algorithms 1 and 2, Sections 3.1-3.4 and 4.1.
Modules: ``kernels`` (SE / polynomial with gradients), ``gp`` (posterior of the gradient), ``acquisition``
(alpha = Tr Sigma, Alg. 1 line 4 and Alg. 2 line 4), ``private_gradient`` (Alg. 1 lines 6-8),
``updates`` (GD / AdaGrad steps), ``losses`` (the built-in per-user losses and the row-independence check
of a plug-in loss) and ``loop`` (an end-to-end run of Algorithm 1 / 2). Accounting (mu-GDP to (epsilon,
delta), the OpenDP Gaussian sampler) is in ``shared.privacy.gdp``.
No web or database imports; randomness only through numpy Generators and noise callables passed in.
"""
