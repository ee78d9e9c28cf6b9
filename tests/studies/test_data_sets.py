"""The lab's written data sets (`studies.data`: the glyphs, the icons) are written once into their folder and reused
only while its manifest names the same data seed and the writer's layout; the test writes no shards."""

import json

import pytest

from studies.data import GlyphData, IconData
from studies.glyphs import write_glyph_dataset
from studies.glyphs.writers import LAYOUT_VERSION as GLYPH_LAYOUT
from studies.icons import write_icon_dataset
from studies.icons.writers import LAYOUT_VERSION as ICON_LAYOUT


@pytest.mark.parametrize(
    "data, writer, layout, folder",
    [(GlyphData, write_glyph_dataset, GLYPH_LAYOUT, "data"), (IconData, write_icon_dataset, ICON_LAYOUT, "icon_data")],
)
def test_a_written_folder_is_reused_only_for_its_data_seed_and_layout(tmp_path, data, writer, layout, folder):
    assert data(seed=3).writer() == (writer, layout) and data(seed=3).folder(tmp_path) == tmp_path / folder
    manifest = tmp_path / folder / "manifest.json"
    manifest.parent.mkdir()
    manifest.write_text(json.dumps({"seed": 3, "layout_version": layout}))
    assert data(seed=3).prepare(tmp_path) == {"seed": 3, "layout_version": layout}
    with pytest.raises(ValueError, match="of data seed 3, not 4: remove it"):
        data(seed=4).prepare(tmp_path)
    manifest.write_text(json.dumps({"seed": 3, "layout_version": layout - 1}))
    with pytest.raises(ValueError, match=f"an earlier layout \\({layout - 1}, this writer's is {layout}\\)"):
        data(seed=3).prepare(tmp_path)
