"""The consortium operator: CA, bundles and the signed session definition (installed as secure_afl.consortium)."""
