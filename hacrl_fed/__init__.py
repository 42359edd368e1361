"""hacrl-fed: federated heterogeneous-agent collaborative RL (HACPO) on Flower.

Sites share verified rollouts (text, reward, one behaviour log-prob scalar per response), never
weights, gradients or token ids.
"""

__version__ = "0.1.0"
