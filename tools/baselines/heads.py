"""Softmax classifier heads on frozen embeddings, in float64 numpy.

Parameters live in one flat vector ``theta`` (what a client sends, weighted,
into the round's secure sum); :attr:`slices` names its blocks. Losses are
the mean cross-entropy over the samples given.
"""

from __future__ import annotations

import numpy as np

__all__ = ["LinearHead", "MLPHead"]


def _softmax_grad(logits: np.ndarray, y: np.ndarray):
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n = logits.shape[0]
    loss = float(-np.mean(np.log(np.maximum(p[np.arange(n), y], 1e-300))))
    p[np.arange(n), y] -= 1.0
    return loss, p / n  # d loss / d logits


class LinearHead:
    """logits = X W + b."""

    kind = "linear"

    def __init__(self, dim: int, n_classes: int):
        self.dim, self.n_classes = int(dim), int(n_classes)
        d, c = self.dim, self.n_classes
        self.slices = {"W": slice(0, d * c), "b": slice(d * c, d * c + c)}
        self.size = d * c + c

    def init(self, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(self.size)

    def _unpack(self, theta):
        s = self.slices
        return theta[s["W"]].reshape(self.dim, self.n_classes), theta[s["b"]]

    def logits(self, theta, X):
        W, b = self._unpack(theta)
        return X @ W + b

    def loss_grad(self, theta, X, y):
        W, b = self._unpack(theta)
        loss, g = _softmax_grad(X @ W + b, y)
        return loss, np.concatenate([(X.T @ g).ravel(), g.sum(axis=0)])

    def predict(self, theta, X):
        return np.argmax(self.logits(theta, X), axis=1)


class MLPHead:
    """logits = relu(X W1 + b1) W2 + b2 with ``hidden`` units.

    :meth:`unit_block` gives, per hidden unit j, the indices of its incoming
    weights and bias (W1[:, j], b1[j]): the "hidden element" FedFac splits.
    """

    kind = "mlp"

    def __init__(self, dim: int, n_classes: int, hidden: int = 64):
        self.dim, self.n_classes, self.hidden = int(dim), int(n_classes), int(hidden)
        d, c, h = self.dim, self.n_classes, self.hidden
        o = 0
        self.slices = {}
        for name, n in (("W1", d * h), ("b1", h), ("W2", h * c), ("b2", c)):
            self.slices[name] = slice(o, o + n)
            o += n
        self.size = o

    def init(self, rng: np.random.Generator) -> np.ndarray:
        d, c, h = self.dim, self.n_classes, self.hidden
        theta = np.zeros(self.size)
        theta[self.slices["W1"]] = rng.normal(0.0, np.sqrt(2.0 / d), d * h)  # He initialisation
        theta[self.slices["W2"]] = rng.normal(0.0, np.sqrt(1.0 / h), h * c)
        return theta

    def _unpack(self, theta):
        s, d, c, h = self.slices, self.dim, self.n_classes, self.hidden
        return theta[s["W1"]].reshape(d, h), theta[s["b1"]], theta[s["W2"]].reshape(h, c), theta[s["b2"]]

    def logits(self, theta, X):
        W1, b1, W2, b2 = self._unpack(theta)
        return np.maximum(X @ W1 + b1, 0.0) @ W2 + b2

    def loss_grad(self, theta, X, y):
        W1, b1, W2, b2 = self._unpack(theta)
        pre = X @ W1 + b1
        H = np.maximum(pre, 0.0)
        loss, g = _softmax_grad(H @ W2 + b2, y)
        gH = (g @ W2.T) * (pre > 0)
        return loss, np.concatenate([(X.T @ gH).ravel(), gH.sum(axis=0), (H.T @ g).ravel(), g.sum(axis=0)])

    def predict(self, theta, X):
        return np.argmax(self.logits(theta, X), axis=1)

    def unit_block(self, theta) -> np.ndarray:
        """(d + 1) x h matrix: column j is hidden unit j's incoming weights and bias."""
        W1, b1, _, _ = self._unpack(theta)
        return np.vstack([W1, b1[None, :]])

    def unit_mask(self, units) -> np.ndarray:
        """Boolean mask over theta selecting W1[:, j] and b1[j] for j in ``units``."""
        m = np.zeros(self.size, dtype=bool)
        sel = np.zeros(self.hidden, dtype=bool)
        sel[np.asarray(list(units), dtype=np.int64)] = True
        w1 = np.zeros((self.dim, self.hidden), dtype=bool)
        w1[:, sel] = True
        m[self.slices["W1"]] = w1.ravel()
        m[self.slices["b1"]] = sel
        return m
