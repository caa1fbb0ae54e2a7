"""lopti-minimal: a small, exact, readable reimplementation of
"Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs" (Yang et al., 2025,
arXiv 2505.12929): GRPO, Advantage Reweighting (AR, Eq. 4) and Low-Probability Token
Isolation (Lopti, Algorithm 1) on Knights-and-Knaves logic puzzles.

See docs/ARCHITECTURE.md for the module map.
"""

__version__ = "0.1.0"
