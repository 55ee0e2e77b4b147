//! Heatmaps as a user sees them: image sizes, a white margin on every side, each cell's colour
//! where the SVG places it (over the cell's whole border in the PNG), the colour bar's ends,
//! panel grids, text in the SVG and ink in the PNG, errors. No pixel layout constant of the
//! implementation is copied here: cells and the colour bar are found through the SVG's
//! `<rect class="cell">` and `<rect class="colorbar">` (the PNG's documented twin) or in the
//! PNG itself, and sizes are pinned as the numbers a user gets.

use candle_mha_test_support as common;

use anyhow::Result;
use candle_mha::candle::{Device, Tensor};
use candle_mha_viz::heatmap::{
    colormap, heatmap_grid_png, heatmap_grid_svg, heatmap_png, heatmap_svg, save, HeatmapOptions,
};
use common::image::Image;
use common::labels;
use common::xml::{self, read_xml, Element, Xml};

const WHITE: [u8; 3] = [255, 255, 255];
const GREY: [u8; 3] = [128, 128, 128];
/// The text colour: the `fill` of every SVG `<text>` label (checked below), the ink of the PNG.
const INK: [u8; 3] = [20, 20, 20];

fn hex(rgb: [u8; 3]) -> String {
    format!("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2])
}

/// A whole-pixel attribute of an SVG element.
fn px(e: &Element, name: &str) -> usize {
    let v = e.attr(name).unwrap_or_else(|| panic!("no {name} on {e:?}"));
    v.parse()
        .unwrap_or_else(|_| panic!("{name}={v:?} on {e:?}"))
}

/// One cell as the SVG places it: top-left corner, side, fill colour.
#[derive(Clone, Debug)]
struct Cell {
    x: usize,
    y: usize,
    side: usize,
    fill: String,
}

/// The cells of each `<g class="panel">`, in document order (row-major), from a document
/// checked to be well-formed.
fn svg_panels(svg: &str) -> Vec<Vec<Cell>> {
    let mut panels: Vec<Vec<Cell>> = Vec::new();
    for t in read_xml(svg) {
        let Xml::Open(e) = t else { continue };
        if e.name == "g" && e.attr("class") == Some("panel") {
            panels.push(Vec::new());
        } else if e.name == "rect" && e.attr("class") == Some("cell") {
            let (w, h) = (px(&e, "width"), px(&e, "height"));
            assert_eq!(w, h, "a square cell: {e:?}");
            panels
                .last_mut()
                .expect("a cell outside a panel")
                .push(Cell {
                    x: px(&e, "x"),
                    y: px(&e, "y"),
                    side: w,
                    fill: e.attr("fill").expect("fill").to_string(),
                });
        }
    }
    panels
}

/// The root `<svg>`'s `(width, height)`.
fn svg_size(svg: &str) -> (usize, usize) {
    let root = &xml::elements(svg)[0];
    assert_eq!(root.name, "svg");
    (px(root, "width"), px(root, "height"))
}

/// The colour bar's `(x, y, width, height)`; there is exactly one.
fn svg_colorbar(svg: &str) -> (usize, usize, usize, usize) {
    let all = xml::elements(svg);
    let bars = xml::with_class(&all, "rect", "colorbar");
    assert_eq!(bars.len(), 1, "one colour bar");
    let b = bars[0];
    (px(b, "x"), px(b, "y"), px(b, "width"), px(b, "height"))
}

/// `cells` are an `l × s` grid of `side`-pixel squares, row-major, edge to edge.
fn assert_grid(cells: &[Cell], l: usize, s: usize, side: usize) {
    assert_eq!(cells.len(), l * s, "{l} × {s} cells");
    let (x0, y0) = (cells[0].x, cells[0].y);
    for (k, c) in cells.iter().enumerate() {
        let (i, j) = (k / s, k % s);
        assert_eq!(c.side, side, "cell ({i},{j})");
        assert_eq!((c.x, c.y), (x0 + j * side, y0 + i * side), "cell ({i},{j})");
    }
}

/// The PNG shows `rgb` over the whole 2-pixel inner border of `cell` (value text never covers
/// it), and the SVG fills the cell with the same colour.
fn assert_cell_colour(img: &Image, cell: &Cell, rgb: [u8; 3], what: &str) {
    assert_eq!(cell.fill, hex(rgb), "{what}: SVG fill");
    let n = cell.side;
    for dy in 0..n {
        for dx in 0..n {
            let border = dx < 2 || dy < 2 || dx + 2 >= n || dy + 2 >= n;
            if border {
                let got = img.at(cell.x + dx, cell.y + dy);
                assert_eq!(got, rgb, "{what}: PNG pixel +{dx},+{dy}");
            }
        }
    }
}

/// Everything drawn stays inside a white margin of 4 to 16 pixels on every side: nothing is
/// cut off and no space is wasted.
fn assert_margins(img: &Image, what: &str) {
    let (x0, y0, x1, y1) = img.ink_box(WHITE).expect("something drawn");
    let gaps = [x0, y0, img.w - 1 - x1, img.h - 1 - y1];
    assert!(
        gaps.iter().all(|g| (4..=16).contains(g)),
        "{what}: white margins left, top, right, bottom = {gaps:?}"
    );
}

/// The colour bar, found through the SVG: vmax at its top row, vmin at its bottom row, its top
/// level with the first row of cells, right of every cell.
fn assert_colorbar(img: &Image, svg: &str, cells: &[Cell]) {
    let (bx, by, bw, bh) = svg_colorbar(svg);
    assert_eq!(img.at(bx + bw / 2, by), colormap(1.0), "bar top");
    assert_eq!(
        img.at(bx + bw / 2, by + bh - 1),
        colormap(0.0),
        "bar bottom"
    );
    assert_eq!(by, cells[0].y, "the bar starts level with the cells");
    assert!(
        cells.iter().all(|c| c.x + c.side < bx),
        "the bar is right of the cells"
    );
}

fn matrix() -> Result<Tensor> {
    Ok(Tensor::new(
        &[
            [0.4519f32, 0.2741, 0.2741],
            [0.1045, 0.5307, 0.3648],
            [0.1387, 0.4842, 0.3771],
        ],
        &Device::Cpu,
    )?)
}

/// The colour of `v` on the scale `lo..hi` (module docs: `(v − vmin) / (vmax − vmin)`).
fn scaled(v: f64, lo: f64, hi: f64) -> [u8; 3] {
    colormap((v - lo) / (hi - lo))
}

#[test]
fn png_size_and_cell_colours_follow_the_layout() -> Result<()> {
    let m = matrix()?;
    let rows = labels(&["the", "cat", "sat"]);
    let cols = labels(&["the", "cat", "sat"]);
    let values = m.to_vec2::<f32>()?;
    let (lo, hi) = (0.1045f64, 0.5307f64);
    for (cell, title, size) in [
        (28, None, (236, 142)),
        (40, Some("weights"), (272, 176)),
        (6, None, (170, 94)),
    ] {
        let opts = HeatmapOptions {
            cell,
            title: title.map(String::from),
            ..Default::default()
        };
        let img = Image::decode(&heatmap_png(&m, &rows, &cols, &opts)?)?;
        let svg = heatmap_svg(&m, &rows, &cols, &opts)?;
        assert_eq!(img.size(), size, "cell {cell}");
        assert_eq!(
            svg_size(&svg),
            size,
            "cell {cell}: the SVG has the PNG's size"
        );
        assert_margins(&img, &format!("cell {cell}"));
        let panels = svg_panels(&svg);
        assert_eq!(panels.len(), 1);
        let cells = &panels[0];
        assert_grid(cells, 3, 3, cell as usize);
        for (k, c) in cells.iter().enumerate() {
            let (i, j) = (k / 3, k % 3);
            let expected = scaled(values[i][j] as f64, lo, hi);
            assert_cell_colour(&img, c, expected, &format!("cell {cell}: ({i},{j})"));
        }
        // The min and max cells are the colormap's ends.
        assert_eq!(img.at(cells[3].x, cells[3].y), colormap(0.0));
        assert_eq!(img.at(cells[4].x, cells[4].y), colormap(1.0));
        if cell == 6 {
            // No value text fits: the min and max cells are the only full squares of their
            // colours in the whole image, found without the SVG.
            for (c, t) in [(&cells[3], 0.0), (&cells[4], 1.0)] {
                let found = img.squares(colormap(t), 6, img.h);
                assert_eq!(found, [(c.x, c.y)], "colour at {t}");
            }
        }
        assert_colorbar(&img, &svg, cells);
        // Printed values (cells of 28 px hold them) and the ticks.
        if cell == 28 {
            assert!(
                svg.contains(">.45</text>") && svg.contains(">.53</text>"),
                "{svg}"
            );
        }
        assert!(svg.contains(">0.531</text>") && svg.contains(">0.105</text>"));
        if let Some(t) = title {
            assert!(svg.contains(&format!(">{t}</text>")));
            // The title is drawn: the PNG holds more ink than the same map without it.
            let untitled = HeatmapOptions {
                title: None,
                ..opts.clone()
            };
            let plain = Image::decode(&heatmap_png(&m, &rows, &cols, &untitled)?)?;
            assert!(img.count(INK) > plain.count(INK) + 50);
            assert!(img.h > plain.h && img.w == plain.w);
        }
    }
    Ok(())
}

#[test]
fn larger_values_map_to_later_colormap_entries() -> Result<()> {
    let m = Tensor::arange(0f32, 12., &Device::Cpu)?.reshape((3, 4))?;
    let rows = labels(&["a", "b", "c"]);
    let cols = labels(&["w", "x", "y", "z"]);
    let opts = HeatmapOptions::default();
    let img = Image::decode(&heatmap_png(&m, &rows, &cols, &opts)?)?;
    assert_eq!(img.size(), (252, 120));
    let cells = &svg_panels(&heatmap_svg(&m, &rows, &cols, &opts)?)[0];
    assert_grid(cells, 3, 4, 28);
    let entry = |rgb: [u8; 3]| {
        (0..=255)
            .position(|k| colormap(k as f64 / 255.0) == rgb)
            .expect("a viridis colour")
    };
    let mut previous = None;
    for (k, c) in cells.iter().enumerate() {
        let e = entry(img.at(c.x, c.y));
        assert_cell_colour(&img, c, colormap(k as f64 / 11.0), &format!("value {k}"));
        if let Some(p) = previous {
            assert!(e > p, "value {k}: entry {e} after {p}");
        }
        previous = Some(e);
    }
    Ok(())
}

#[test]
fn long_labels_rotate_and_truncate_vmin_vmax_and_nan() -> Result<()> {
    let m = Tensor::new(&[[f32::NAN, 2.0], [3.0, f32::NEG_INFINITY]], &Device::Cpu)?;
    let rows = labels(&["a-very-long-row-label-indeed", "b"]);
    let cols = labels(&["column-one", "c2"]);
    let opts = HeatmapOptions {
        vmin: Some(0.0),
        vmax: Some(4.0),
        ..Default::default()
    };
    let img = Image::decode(&heatmap_png(&m, &rows, &cols, &opts)?)?;
    let svg = heatmap_svg(&m, &rows, &cols, &opts)?;
    assert_eq!(img.size(), (364, 198));
    assert_eq!(svg_size(&svg), (364, 198));
    assert_margins(&img, "long labels");
    let cells = &svg_panels(&svg)[0];
    assert_grid(cells, 2, 2, 28);
    assert_cell_colour(&img, &cells[0], GREY, "NaN");
    assert_cell_colour(&img, &cells[3], GREY, "-inf");
    assert_cell_colour(&img, &cells[1], colormap(0.5), "2 on 0..4");
    assert_cell_colour(&img, &cells[2], colormap(0.75), "3 on 0..4");
    // What the reader sees: the row label cut to 16 characters, column labels read upwards
    // (wider than a cell), the full labels and values in the cells' titles, the given ticks.
    assert!(svg.contains(">a-very-long-row~</text>"), "{svg}");
    assert_eq!(svg.matches("rotate(-90)").count(), 2, "{svg}");
    assert!(svg.contains("<title>a-very-long-row-label-indeed → column-one: NaN</title>"));
    assert!(svg.contains("<title>b → c2: -inf</title>"));
    assert!(svg.contains(">4.000</text>") && svg.contains(">0.000</text>"));
    Ok(())
}

#[test]
fn grid_has_one_panel_per_head_and_a_shared_scale() -> Result<()> {
    let dev = Device::Cpu;
    let rows = labels(&["q0", "q1"]);
    let cols = labels(&["k0", "k1", "k2"]);
    // (H, size with panel titles, size without).
    for (h, titled, untitled) in [
        (1usize, (224, 132), (224, 112)),
        (2, (366, 132), (366, 112)),
        (3, (366, 244), (366, 204)),
        (4, (366, 244), (366, 204)),
        (5, (496, 244), (496, 204)),
        (8, (496, 356), (496, 296)),
    ] {
        let w = Tensor::arange(0f32, (h * 6) as f32, &dev)?.reshape((h, 2, 3))?;
        let heads: Vec<Tensor> = (0..h).map(|i| w.get(i)).collect::<candle::Result<_>>()?;
        let titles: Vec<String> = (0..h).map(|i| format!("head {i}")).collect();
        let opts = HeatmapOptions {
            title: Some("layer 0".into()),
            ..Default::default()
        };
        let img = Image::decode(&heatmap_grid_png(&heads, &titles, &rows, &cols, &opts)?)?;
        let svg = heatmap_grid_svg(&heads, &titles, &rows, &cols, &opts)?;
        assert_eq!(img.size(), titled, "H = {h}");
        assert_eq!(svg_size(&svg), titled, "H = {h}");
        assert_margins(&img, &format!("H = {h}"));
        let panels = svg_panels(&svg);
        assert_eq!(panels.len(), h);
        // ⌈√H⌉ panels across, filled row by row.
        let ncols = (1..=h).find(|c| c * c >= h).unwrap();
        let xs: Vec<usize> = panels.iter().map(|p| p[0].x).collect();
        let ys: Vec<usize> = panels.iter().map(|p| p[0].y).collect();
        for p in 0..h {
            assert_eq!(xs[p], xs[p % ncols], "H {h} panel {p}: its column");
            assert_eq!(ys[p], ys[p / ncols * ncols], "H {h} panel {p}: its row");
            if p % ncols > 0 {
                assert!(
                    xs[p] > xs[p - 1],
                    "H {h} panel {p}: right of the previous one"
                );
            }
            if p >= ncols {
                assert!(
                    ys[p] > ys[p - ncols],
                    "H {h} panel {p}: below the one above"
                );
            }
        }
        let max = (h * 6 - 1) as f64;
        for (p, cells) in panels.iter().enumerate() {
            assert_grid(cells, 2, 3, 28);
            for (i, j) in [(0usize, 0usize), (1, 2)] {
                let c = &cells[i * 3 + j];
                let v = (p * 6 + i * 3 + j) as f64;
                let expected = colormap(if max > 0.0 { v / max } else { 0.5 });
                assert_eq!(img.at(c.x + 1, c.y + 1), expected, "H {h} panel {p}");
                assert_cell_colour(&img, c, expected, &format!("H {h} panel {p} ({i},{j})"));
            }
            assert!(
                svg.contains(&format!(">head {p}</text>")),
                "H {h}: panel title {p}"
            );
        }
        assert_colorbar(&img, &svg, &panels[0]);
        // Without panel titles the panels are shorter.
        let plain = Image::decode(&heatmap_grid_png(&heads, &[], &rows, &cols, &opts)?)?;
        assert_eq!(plain.size(), untitled, "H = {h} untitled");
        assert!(plain.h < img.h);
    }
    Ok(())
}

#[test]
fn svg_is_well_formed_with_one_rect_per_cell() -> Result<()> {
    let m = matrix()?;
    let rows = labels(&["<the>", "cat & co", "sat"]);
    let cols = labels(&["the", "cat", "\"sat\""]);
    let opts = HeatmapOptions {
        title: Some("a < b".into()),
        ..Default::default()
    };
    let svg = heatmap_svg(&m, &rows, &cols, &opts)?;
    // Well-formed (the shared reader panics otherwise), one root <svg>, the PNG's size.
    let elements = xml::elements(&svg);
    assert_eq!(elements[0].name, "svg");
    assert_eq!(svg_size(&svg), (296, 186));
    let img = Image::decode(&heatmap_png(&m, &rows, &cols, &opts)?)?;
    assert_eq!(img.size(), (296, 186));

    let panels = svg_panels(&svg);
    let cells = &panels[0];
    assert_eq!(cells.len(), 9);
    assert_grid(cells, 3, 3, 28);
    assert_eq!(xml::with_class(&elements, "rect", "cell").len(), 9);
    let values = m.to_vec2::<f32>()?;
    for (k, c) in cells.iter().enumerate() {
        let (i, j) = (k / 3, k % 3);
        let rgb = scaled(values[i][j] as f64, 0.1045, 0.5307);
        // The SVG's fill, and the PNG's colour at the SVG's place.
        assert_cell_colour(&img, c, rgb, &format!("cell {k}"));
    }
    // Every label in the text colour.
    for e in elements.iter().filter(|e| e.name == "text") {
        assert!(
            matches!(e.attr("fill"), Some(f) if f == hex(INK) || f == "#ffffff" || f == "#000000"),
            "{e:?}"
        );
    }
    // One <title> per cell, with escaped labels and the value.
    assert_eq!(svg.matches("<title>").count(), 9);
    assert!(svg.contains("<title>&lt;the&gt; → the: 0.4519</title>"));
    assert!(svg.contains("cat &amp; co"));
    assert!(svg.contains("&quot;sat&quot;"));
    assert!(svg.contains(">a &lt; b</text>"));
    assert!(svg.contains(">0.531</text>") && svg.contains(">0.105</text>")); // the ticks (f32 0.1045 is 0.10450000…)
    Ok(())
}

#[test]
fn grid_svg_has_every_panel() -> Result<()> {
    let w = Tensor::rand(0f32, 1., (4, 3, 5), &Device::Cpu)?;
    let heads: Vec<Tensor> = (0..4).map(|i| w.get(i)).collect::<candle::Result<_>>()?;
    let titles: Vec<String> = (0..4).map(|i| format!("head {i}")).collect();
    let rows = labels(&["a", "b", "c"]);
    let cols = labels(&["1", "2", "3", "4", "5"]);
    let svg = heatmap_grid_svg(&heads, &titles, &rows, &cols, &HeatmapOptions::default())?;
    let elements = xml::elements(&svg);
    assert_eq!(xml::with_class(&elements, "rect", "cell").len(), 4 * 3 * 5);
    assert_eq!(xml::with_class(&elements, "g", "panel").len(), 4);
    let png = Image::decode(&heatmap_grid_png(
        &heads,
        &titles,
        &rows,
        &cols,
        &HeatmapOptions::default(),
    )?)?;
    assert_eq!(svg_size(&svg), png.size());
    Ok(())
}

#[test]
fn errors_name_the_problem() -> Result<()> {
    let dev = Device::Cpu;
    let m = matrix()?;
    let three = labels(&["a", "b", "c"]);
    let two = labels(&["a", "b"]);
    let opts = HeatmapOptions::default();
    let msg = |r: candle::Result<Vec<u8>>| r.unwrap_err().to_string();

    let e = msg(heatmap_png(&m, &two, &three, &opts));
    assert!(
        e.contains("2 row labels") && e.contains("expected 3"),
        "{e}"
    );
    let e = msg(heatmap_png(&m, &three, &two, &opts));
    assert!(e.contains("2 column labels"), "{e}");
    let e = msg(heatmap_png(&m.unsqueeze(0)?, &three, &three, &opts));
    assert!(e.contains("2-D") && e.contains("[1, 3, 3]"), "{e}");
    let empty = Tensor::zeros((0, 3), candle::DType::F32, &dev)?;
    let e = msg(heatmap_png(&empty, &[], &three, &opts));
    assert!(e.contains("empty"), "{e}");
    let e = msg(heatmap_png(
        &m,
        &three,
        &three,
        &HeatmapOptions {
            cell: 0,
            ..Default::default()
        },
    ));
    assert!(e.contains("opts.cell"), "{e}");
    let bad = HeatmapOptions {
        vmin: Some(1.0),
        vmax: Some(0.0),
        ..Default::default()
    };
    let e = msg(heatmap_png(&m, &three, &three, &bad));
    assert!(e.contains("vmin") && e.contains("vmax"), "{e}");
    let bad = HeatmapOptions {
        vmax: Some(f64::NAN),
        ..Default::default()
    };
    assert!(msg(heatmap_png(&m, &three, &three, &bad)).contains("opts.vmax"));
    let huge = HeatmapOptions {
        cell: 100_000,
        ..Default::default()
    };
    assert!(msg(heatmap_png(&m, &three, &three, &huge)).contains("pixel limit"));

    let e = msg(heatmap_grid_png(&[], &[], &three, &three, &opts));
    assert!(e.contains("empty"), "{e}");
    let other = Tensor::zeros((3, 2), candle::DType::F32, &dev)?;
    let e = msg(heatmap_grid_png(
        &[m.clone(), other],
        &[],
        &three,
        &three,
        &opts,
    ));
    assert!(e.contains("matrices[1]") && e.contains("[3, 2]"), "{e}");
    let e = msg(heatmap_grid_png(
        &[m.clone(), m.clone()],
        &two[..1],
        &three,
        &three,
        &opts,
    ));
    assert!(e.contains("1 titles for 2 matrices"), "{e}");
    let e = heatmap_svg(&m, &two, &three, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("heatmap_svg"), "{e}");
    Ok(())
}

#[test]
fn save_writes_the_bytes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let m = matrix()?;
    let l = labels(&["a", "b", "c"]);
    let png = heatmap_png(&m, &l, &l, &HeatmapOptions::default())?;
    let path = dir.path().join("w.png");
    save(&path, &png)?;
    assert_eq!(std::fs::read(&path)?, png);
    let e = save(&dir.path().join("missing/w.png"), &png).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
    Ok(())
}
