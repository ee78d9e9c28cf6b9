"""Rendering a scene to pixels (deterministic: the noise has its own seed in the scene)."""

from __future__ import annotations

from typing import Iterable

import numpy as np
from PIL import Image, ImageDraw

from .scenes import Scene


def render(scene: Scene) -> Image.Image:
    """The scene as an RGB image of `scene.image_size` pixels (deterministic).

    Shapes are drawn at `supersample` times the size on a transparent layer and box-filtered
    down (anti-aliased edges), then laid over the shaded background; noise comes last.
    """
    size, scale = scene.image_size, scene.supersample
    ramp = np.linspace(-0.5, 0.5, size)
    angle, amplitude = scene.gradient
    shade = amplitude * (np.cos(angle) * ramp[None, :] + np.sin(angle) * ramp[:, None])
    background = np.array(scene.background, dtype=np.float64) + shade[:, :, None]
    layer = Image.new("RGBA", (size * scale, size * scale))
    draw = ImageDraw.Draw(layer)
    for placed in scene.objects:
        _draw_shape(
            draw, placed.spec.shape, placed.x * scale, placed.y * scale, placed.radius * scale, (*placed.rgb, 255)
        )
    shapes = np.asarray(layer.resize((size, size), Image.Resampling.BOX), dtype=np.float64)
    alpha = shapes[:, :, 3:] / 255
    noise = np.random.default_rng(scene.noise_seed).normal(0.0, scene.noise_std, (size, size, 3))
    pixels = background * (1 - alpha) + shapes[:, :, :3] * alpha + noise
    return Image.fromarray(np.clip(pixels, 0, 255).round().astype(np.uint8))


def _regular_polygon(x: float, y: float, radii: Iterable[float], start_deg: float) -> list[tuple[float, float]]:
    radii = list(radii)
    angles = np.deg2rad(start_deg + 360.0 * np.arange(len(radii)) / len(radii))
    return [(x + r * np.cos(a), y + r * np.sin(a)) for r, a in zip(radii, angles)]


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, x: float, y: float, r: float, rgb: tuple[int, ...]) -> None:
    """Shapes of similar area for one radius, so size words mean the same for every shape."""
    if shape == "circle":
        draw.ellipse([x - r, y - r, x + r, y + r], fill=rgb)
    elif shape == "square":
        half = 0.85 * r
        draw.rectangle([x - half, y - half, x + half, y + half], fill=rgb)
    elif shape == "triangle":
        draw.polygon(_regular_polygon(x, y + 0.2 * r, [1.2 * r] * 3, -90), fill=rgb)
    elif shape == "cross":
        arm = 0.36 * r
        draw.rectangle([x - r, y - arm, x + r, y + arm], fill=rgb)
        draw.rectangle([x - arm, y - r, x + arm, y + r], fill=rgb)
    else:
        raise ValueError(f"unknown shape {shape!r}")
