//! Heatmaps: PNG size and pixels from the documented layout, SVG structure, grids, errors.

use anyhow::Result;
use candle_mha::analysis::heatmap::{
    colormap, heatmap_grid_png, heatmap_grid_svg, heatmap_png, heatmap_svg, save, HeatmapOptions,
};
use candle_mha::candle::{Device, Tensor};

// The layout constants documented in src/analysis/heatmap.rs.
const CW: u32 = 12;
const CH: u32 = 14;
const MARGIN: u32 = 8;
const GAP: u32 = 6;
const BAR_GAP: u32 = 12;
const BAR_W: u32 = 16;
const PANEL_GAP: u32 = 16;
const MIN_BAR_H: u32 = 36;

fn labels(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn chars(s: &str) -> u32 {
    s.chars().count() as u32
}

fn tick(v: f64, vmin: f64, vmax: f64) -> String {
    let m = vmin.abs().max(vmax.abs());
    if m == 0.0 || (1e-3..1e5).contains(&m) {
        format!("{v:.3}").replace("-0.000", "0.000")
    } else {
        format!("{v:.2e}")
    }
}

/// The module docs' layout, recomputed independently: (width, height, first cell of panel p).
struct Layout {
    width: u32,
    height: u32,
    ncols: u32,
    panel_w: u32,
    panel_h: u32,
    cells_x: u32,
    cells_y: u32,
    title_h: u32,
    block_w: u32,
    bar_h: u32,
}

#[allow(clippy::too_many_arguments)]
fn layout(
    l: usize,
    s: usize,
    h: usize,
    rows: &[String],
    cols: &[String],
    titles: &[String],
    title: Option<&str>,
    cell: u32,
    vmin: f64,
    vmax: f64,
) -> Layout {
    let longest = |v: &[String]| v.iter().map(|x| chars(x).min(16)).max().unwrap_or(0);
    let (rl, cl) = (longest(rows), longest(cols));
    let pt = titles.iter().map(|t| chars(t).min(24)).max().unwrap_or(0);
    let col_label_h = if cl == 0 {
        0
    } else if cl * CW <= cell {
        CH
    } else {
        cl * CW
    };
    let panel_title_h = if titles.is_empty() { 0 } else { CH + GAP };
    let cells_x = rl * CW + GAP;
    let cells_y = panel_title_h + col_label_h + GAP;
    let panel_w = (cells_x + s as u32 * cell).max(pt * CW);
    let panel_h = cells_y + l as u32 * cell;
    let h = h as u32;
    let ncols = (h as f64).sqrt().ceil() as u32;
    let nrows = h.div_ceil(ncols);
    let block_w = ncols * panel_w + (ncols - 1) * PANEL_GAP;
    let block_h = nrows * panel_h + (nrows - 1) * PANEL_GAP;
    let bar_h = (block_h - cells_y).max(MIN_BAR_H);
    let tick_w = chars(&tick(vmin, vmin, vmax)).max(chars(&tick(vmax, vmin, vmax))) * CW;
    let title_h = if title.is_some() { CH + GAP } else { 0 };
    let tw = title.map_or(0, |t| chars(t).min(100)) * CW;
    let width = (MARGIN + block_w + BAR_GAP + BAR_W + GAP + tick_w + MARGIN).max(2 * MARGIN + tw);
    let height = MARGIN + title_h + block_h.max(cells_y + bar_h) + MARGIN;
    Layout {
        width,
        height,
        ncols,
        panel_w,
        panel_h,
        cells_x,
        cells_y,
        title_h,
        block_w,
        bar_h,
    }
}

impl Layout {
    /// Top-left pixel of cell (i, j) of panel p.
    fn cell(&self, p: u32, i: u32, j: u32, cell: u32) -> (u32, u32) {
        let (pc, pr) = (p % self.ncols, p / self.ncols);
        let px = MARGIN + pc * (self.panel_w + PANEL_GAP);
        let py = MARGIN + self.title_h + pr * (self.panel_h + PANEL_GAP);
        (px + self.cells_x + j * cell, py + self.cells_y + i * cell)
    }
}

/// Decoded RGB image.
struct Image {
    width: u32,
    height: u32,
    px: Vec<u8>,
}

impl Image {
    fn at(&self, x: u32, y: u32) -> [u8; 3] {
        let i = (y * self.width + x) as usize * 3;
        [self.px[i], self.px[i + 1], self.px[i + 2]]
    }
}

fn decode(bytes: &[u8]) -> Result<Image> {
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info()?;
    let mut px = vec![0; reader.output_buffer_size().expect("buffer size")];
    let info = reader.next_frame(&mut px)?;
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    px.truncate(info.buffer_size());
    Ok(Image {
        width: info.width,
        height: info.height,
        px,
    })
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

#[test]
fn png_size_and_cell_colours_follow_the_layout() -> Result<()> {
    let m = matrix()?;
    let rows = labels(&["the", "cat", "sat"]);
    let cols = labels(&["the", "cat", "sat"]);
    for (cell, title) in [(28, None), (40, Some("weights")), (6, None)] {
        let opts = HeatmapOptions {
            cell,
            title: title.map(String::from),
            ..Default::default()
        };
        let img = decode(&heatmap_png(&m, &rows, &cols, &opts)?)?;
        let lay = layout(3, 3, 1, &rows, &cols, &[], title, cell, 0.1045, 0.5307);
        assert_eq!(
            (img.width, img.height),
            (lay.width, lay.height),
            "cell {cell}"
        );
        let values = m.to_vec2::<f32>()?;
        let (lo, hi) = (0.1045f64, 0.5307f64);
        for i in 0..3 {
            for j in 0..3 {
                let (x, y) = lay.cell(0, i, j, cell);
                let v = values[i as usize][j as usize] as f64;
                let expected = colormap((v - lo) / (hi - lo));
                // The 2-px border of every cell is never covered by value text.
                for (dx, dy) in [(0, 0), (1, 1), (cell - 1, cell - 1), (cell - 2, 0)] {
                    assert_eq!(
                        img.at(x + dx, y + dy),
                        expected,
                        "cell ({i},{j}) at +{dx},{dy}"
                    );
                }
            }
        }
        // The min and max cells are the colormap's ends.
        let (x, y) = lay.cell(0, 1, 0, cell);
        assert_eq!(img.at(x, y), colormap(0.0));
        let (x, y) = lay.cell(0, 1, 1, cell);
        assert_eq!(img.at(x, y), colormap(1.0));
        // The colour bar: vmax at its top row, vmin at its bottom row.
        let bx = MARGIN + lay.block_w + BAR_GAP + BAR_W / 2;
        let by = MARGIN + lay.title_h + lay.cells_y;
        assert_eq!(img.at(bx, by), colormap(1.0));
        assert_eq!(img.at(bx, by + lay.bar_h - 1), colormap(0.0));
    }
    Ok(())
}

#[test]
fn larger_values_map_to_later_colormap_entries() -> Result<()> {
    let m = Tensor::arange(0f32, 12., &Device::Cpu)?.reshape((3, 4))?;
    let rows = labels(&["a", "b", "c"]);
    let cols = labels(&["w", "x", "y", "z"]);
    let opts = HeatmapOptions::default();
    let img = decode(&heatmap_png(&m, &rows, &cols, &opts)?)?;
    let lay = layout(3, 4, 1, &rows, &cols, &[], None, 28, 0., 11.);
    let entry = |rgb: [u8; 3]| {
        (0..=255)
            .position(|k| colormap(k as f64 / 255.0) == rgb)
            .expect("a viridis colour")
    };
    let mut previous = None;
    for k in 0..12u32 {
        let (x, y) = lay.cell(0, k / 4, k % 4, 28);
        let e = entry(img.at(x, y));
        assert_eq!(img.at(x, y), colormap(k as f64 / 11.0));
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
    let img = decode(&heatmap_png(&m, &rows, &cols, &opts)?)?;
    let lay = layout(2, 2, 1, &rows, &cols, &[], None, 28, 0.0, 4.0);
    assert_eq!((img.width, img.height), (lay.width, lay.height));
    let grey = [128, 128, 128];
    let at = |i, j| {
        let (x, y) = lay.cell(0, i, j, 28);
        img.at(x, y)
    };
    assert_eq!(at(0, 0), grey);
    assert_eq!(at(1, 1), grey);
    assert_eq!(at(0, 1), colormap(0.5));
    assert_eq!(at(1, 0), colormap(0.75));
    Ok(())
}

#[test]
fn grid_has_one_panel_per_head_and_a_shared_scale() -> Result<()> {
    let dev = Device::Cpu;
    let rows = labels(&["q0", "q1"]);
    let cols = labels(&["k0", "k1", "k2"]);
    for h in [1usize, 2, 3, 4, 5, 8] {
        let w = Tensor::arange(0f32, (h * 6) as f32, &dev)?.reshape((h, 2, 3))?;
        let heads: Vec<Tensor> = (0..h).map(|i| w.get(i)).collect::<candle::Result<_>>()?;
        let titles: Vec<String> = (0..h).map(|i| format!("head {i}")).collect();
        let opts = HeatmapOptions {
            title: Some("layer 0".into()),
            ..Default::default()
        };
        let img = decode(&heatmap_grid_png(&heads, &titles, &rows, &cols, &opts)?)?;
        let max = (h * 6 - 1) as f64;
        let lay = layout(
            2,
            3,
            h,
            &rows,
            &cols,
            &titles,
            Some("layer 0"),
            28,
            0.0,
            max,
        );
        assert_eq!((img.width, img.height), (lay.width, lay.height), "H = {h}");
        for p in 0..h as u32 {
            for (i, j) in [(0u32, 0u32), (1, 2)] {
                let (x, y) = lay.cell(p, i, j, 28);
                let v = (p * 6 + i * 3 + j) as f64;
                let expected = if max > 0.0 { v / max } else { 0.5 };
                assert_eq!(img.at(x + 1, y + 1), colormap(expected), "H {h} panel {p}");
            }
        }
        // Without panel titles the panels are shorter.
        let untitled = decode(&heatmap_grid_png(&heads, &[], &rows, &cols, &opts)?)?;
        let lay = layout(2, 3, h, &rows, &cols, &[], Some("layer 0"), 28, 0.0, max);
        assert_eq!((untitled.width, untitled.height), (lay.width, lay.height));
    }
    Ok(())
}

/// Hand-written well-formedness check: every tag closes in order, attributes are quoted,
/// nothing is left open. Returns the start tags seen, with their raw attribute text.
fn check_xml(doc: &str) -> Vec<(String, String)> {
    let mut stack: Vec<String> = Vec::new();
    let mut tags = Vec::new();
    let mut rest = doc;
    let mut root_seen = false;
    while let Some(start) = rest.find('<') {
        let text = &rest[..start];
        assert!(!text.contains('>'), "stray '>' in text {text:?}");
        if stack.is_empty() && root_seen {
            assert!(text.trim().is_empty(), "content after the root: {text:?}");
        }
        let end = rest[start..].find('>').expect("unclosed tag") + start;
        let tag = &rest[start + 1..end];
        rest = &rest[end + 1..];
        if let Some(pi) = tag.strip_prefix('?') {
            assert!(pi.ends_with('?') && stack.is_empty() && !root_seen, "{tag}");
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack
                .pop()
                .unwrap_or_else(|| panic!("</{name}> closes nothing"));
            assert_eq!(open, name.trim(), "mismatched close");
            continue;
        }
        let self_closing = tag.ends_with('/');
        let body = tag.trim_end_matches('/');
        let (name, attrs) = body.split_once(' ').unwrap_or((body, ""));
        assert!(!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_eq!(
            attrs.matches('"').count() % 2,
            0,
            "unbalanced quotes in <{tag}>"
        );
        assert!(!attrs.contains('<') && !attrs.contains('&') || attrs.contains("&amp;"));
        if stack.is_empty() {
            assert!(!root_seen, "second root element <{name}>");
            root_seen = true;
        }
        tags.push((name.to_string(), attrs.to_string()));
        if !self_closing {
            stack.push(name.to_string());
        }
    }
    assert!(stack.is_empty(), "left open: {stack:?}");
    assert!(root_seen);
    tags
}

fn attr<'a>(attrs: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let padded = format!(" {attrs}");
    let start = padded.find(&key)? + key.len();
    let len = padded[start..].find('"')?;
    // Same offsets in `attrs`, one shorter for the added space.
    Some(&attrs[start - 1..start - 1 + len])
}

fn hex(rgb: [u8; 3]) -> String {
    format!("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2])
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
    let tags = check_xml(&svg);
    let (root, root_attrs) = &tags[0];
    assert_eq!(root, "svg");
    let lay = layout(
        3,
        3,
        1,
        &rows,
        &cols,
        &[],
        Some("a < b"),
        28,
        0.1045,
        0.5307,
    );
    assert_eq!(
        attr(root_attrs, "width"),
        Some(lay.width.to_string().as_str())
    );
    assert_eq!(
        attr(root_attrs, "height"),
        Some(lay.height.to_string().as_str())
    );
    // The PNG has the same size.
    let img = decode(&heatmap_png(&m, &rows, &cols, &opts)?)?;
    assert_eq!((img.width, img.height), (lay.width, lay.height));

    let cells: Vec<&String> = tags
        .iter()
        .filter(|(n, a)| n == "rect" && attr(a, "class") == Some("cell"))
        .map(|(_, a)| a)
        .collect();
    assert_eq!(cells.len(), 9);
    let values = m.to_vec2::<f32>()?;
    for (k, a) in cells.iter().enumerate() {
        let (i, j) = (k / 3, k % 3);
        let t = (values[i][j] as f64 - 0.1045) / (0.5307 - 0.1045);
        assert_eq!(attr(a, "fill"), Some(hex(colormap(t)).as_str()), "cell {k}");
        let (x, y) = lay.cell(0, i as u32, j as u32, 28);
        assert_eq!(attr(a, "x"), Some(x.to_string().as_str()));
        assert_eq!(attr(a, "y"), Some(y.to_string().as_str()));
    }
    // One <title> per cell, with escaped labels and the value.
    assert_eq!(svg.matches("<title>").count(), 9);
    assert!(svg.contains("<title>&lt;the&gt; → the: 0.4519</title>"));
    assert!(svg.contains("cat &amp; co"));
    assert!(svg.contains("&quot;sat&quot;"));
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
    let tags = check_xml(&svg);
    let cells = tags
        .iter()
        .filter(|(n, a)| n == "rect" && attr(a, "class") == Some("cell"))
        .count();
    assert_eq!(cells, 4 * 3 * 5);
    assert_eq!(svg.matches(r#"<g class="panel""#).count(), 4);
    let png = decode(&heatmap_grid_png(
        &heads,
        &titles,
        &rows,
        &cols,
        &HeatmapOptions::default(),
    )?)?;
    assert!(svg.contains(&format!(r#"width="{}" height="{}""#, png.width, png.height)));
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
