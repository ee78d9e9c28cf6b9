"""A registry a test may register into and throw away: its entries copied, restored when the test ends."""


def scratch_entries(monkeypatch, registry) -> None:
    """Register into `registry` (an open_clip_adacl.registry.Registry) for this test only."""
    monkeypatch.setattr(registry, "_items", dict(registry._items))
    monkeypatch.setattr(registry, "_aliases", dict(registry._aliases))
