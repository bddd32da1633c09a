"""Tools around the library, not part of it: the demo, benchmarks, attack demonstrations, baselines, reproduce.

Installed as ``secure_afl_tools``; the ``secure-afl`` console script imports a
tool only when its command is named. Nothing in secure_afl/, server/, clients/
or keyholder/ imports from here.
"""
