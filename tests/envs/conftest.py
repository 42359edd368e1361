"""The TextArena games that are not registered by default (``textarena_env.MORE_GAMES``), registered under
``test/textarena/<id>`` for these tests."""

from __future__ import annotations

from hacrl_fed.envs import env_ids, register, textarena_env

for _game in textarena_env.MORE_GAMES:
    if f"test/textarena/{_game}" not in env_ids():
        register(f"test/textarena/{_game}", textarena_env.factory(_game))
