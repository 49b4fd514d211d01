"""Models the engine can serve, by name."""

from engine.models.base import Model

MODELS = ("echo",)


def build_model(name: str, slots: int) -> Model:
    if name == "echo":
        from engine.models.echo import EchoModel

        return EchoModel(slots)
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
