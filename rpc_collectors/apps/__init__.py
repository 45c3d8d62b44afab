"""Applications built on the collectors: PPO written plainly (:mod:`.ppo`), the end-to-end demo
(:mod:`.demo`) and the ``rpc-collectors`` command (:mod:`.cli`).

May import every layer below; nothing in the library imports it.
"""
