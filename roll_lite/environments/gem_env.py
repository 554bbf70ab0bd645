"""`gem`: any environment of GEM (gem-llm 0.1.0, the `envs` extra: `bash scripts/setup.sh dev,envs`) by its GEM id.

    environment: {name: gem, kwargs: {env_id: "game:GuessTheNumber-v0-easy"}}

The other kwargs go to gem.make(env_id, ...). GEM's reset takes only a seed, so a dataset row's
fields are not passed to it. GEM environments satisfy the contract themselves: a GEM class can
also be named by its import path (gem.envs.game_env.guess_the_number:GuessTheNumberEnv, built
with the kwargs that GEM's registry would have given it).

Note: GEM's reset(seed) seeds Python's and numpy's global generators (gem.utils.seeding), which
the environments of one worker process share; an environment that draws at step time is then
reproducible only as long as its neighbours draw in the same order.
"""

from __future__ import annotations

from roll_lite.environments.registry import register_environment


@register_environment("gem")
class GemEnvironment:
    def __init__(self, env_id: str, **kwargs):
        try:
            import gem
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                f"the 'gem' environment needs GEM: pip install gem-llm==0.1.0 (in a clone: "
                f"bash scripts/setup.sh dev,envs) ({error})",
                name=error.name,
            ) from None
        self.env = gem.make(env_id, **kwargs)

    def reset(self, seed: int | None = None):
        return self.env.reset(seed=seed)

    def step(self, action: str):
        return self.env.step(action)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()
