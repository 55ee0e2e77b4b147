//! Line charts: the PNG decodes at the requested size, each series is drawn in its colour in
//! the right direction, markers, clipping, log scale, text; the SVG's structure; errors.

use candle_mha_test_support as common;

use anyhow::Result;
use candle_mha_viz::{LinePlot, Series};
use common::image::Image;
use common::xml;

// matplotlib's tab10, the first four (the documented default palette).
const BLUE: [u8; 3] = [0x1f, 0x77, 0xb4];
const ORANGE: [u8; 3] = [0xff, 0x7f, 0x0e];
/// Text and frame colour (module docs: `#141414`).
const INK: [u8; 3] = [20, 20, 20];
/// The documented `MARGIN` and text line height `CH`.
const MARGIN: usize = 8;
const CH: usize = 14;

/// The row and first/last column of the frame's top edge: the first row holding an
/// unbroken run of at least 100 ink pixels.
fn frame_top(img: &Image) -> (usize, usize, usize) {
    for y in 0..img.h {
        let mut start = 0;
        for x in 0..=img.w {
            if x < img.w && img.at(x, y) == INK {
                continue;
            }
            if x - start >= 100 {
                return (y, start, x - 1);
            }
            start = x + 1;
        }
    }
    panic!("no frame");
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0.0), |(s, n), x| (s + x, n + 1.0));
    s / n
}

/// Mean row of the pixels left of the median column, and right of it.
fn left_right_rows(pixels: &[(usize, usize)]) -> (f64, f64) {
    let mut xs: Vec<usize> = pixels.iter().map(|p| p.0).collect();
    xs.sort();
    let mid = xs[xs.len() / 2];
    let left = mean(pixels.iter().filter(|p| p.0 < mid).map(|p| p.1 as f64));
    let right = mean(pixels.iter().filter(|p| p.0 > mid).map(|p| p.1 as f64));
    (left, right)
}

/// Rows above the legend of a chart with one legend row: `height − MARGIN − LINE` minus the
/// gap above it.
fn above_legend(h: usize) -> usize {
    h - MARGIN - 18 - 6
}

fn two_series(width: u32, height: u32) -> LinePlot {
    let mut plot = LinePlot::new(width, height);
    plot.title = Some("Rising and falling".into());
    plot.x_label = "step".into();
    plot.y_label = "loss".into();
    let up: Vec<(f64, f64)> = (0..=100).map(|i| (i as f64, i as f64 * 0.5)).collect();
    plot.series.push(Series::new("up", up));
    let down = vec![(10.0, 45.0), (50.0, 25.0), (90.0, 5.0)];
    plot.series
        .push(Series::new("down", down).dashed().with_markers());
    plot
}

#[test]
fn png_has_the_size_colours_directions_markers_and_text() -> Result<()> {
    let plot = two_series(640, 400);
    let img = Image::decode(&plot.to_png()?)?;
    assert_eq!((img.w, img.h), (640, 400));
    let rows = above_legend(img.h);

    let blue = img.pixels(BLUE, rows);
    let orange = img.pixels(ORANGE, rows);
    assert!(blue.len() > 500, "the rising line: {} pixels", blue.len());
    assert!(
        orange.len() > 150,
        "the falling line: {} pixels",
        orange.len()
    );
    // Rising: the right half's pixels are higher up (smaller rows), by most of the plot.
    let (l, r) = left_right_rows(&blue);
    assert!(
        l - r > 100.0,
        "rising series: left rows {l}, right rows {r}"
    );
    let (l, r) = left_right_rows(&orange);
    assert!(
        r - l > 50.0,
        "falling series: left rows {l}, right rows {r}"
    );
    // One 7×7 marker per point of the dashed series, none on the solid one.
    assert_eq!(img.squares(ORANGE, 7, rows).len(), 3);
    assert!(img.squares(BLUE, 7, rows).is_empty());
    // Dashed: along the falling line some columns between the markers have no orange.
    let (x0, x1) = (
        orange.iter().map(|p| p.0).min().unwrap(),
        orange.iter().map(|p| p.0).max().unwrap(),
    );
    let gaps = (x0..=x1)
        .filter(|&x| !orange.iter().any(|p| p.0 == x))
        .count();
    assert!(gaps > 20, "a dashed line has gaps: {gaps} empty columns");
    // A solid line has none (alone: the dashed line's marker covers it where they cross).
    let mut alone = plot.clone();
    alone.series.truncate(1);
    let img1 = Image::decode(&alone.to_png()?)?;
    let blue1 = img1.pixels(BLUE, rows);
    let (b0, b1) = (
        blue1.iter().map(|p| p.0).min().unwrap(),
        blue1.iter().map(|p| p.0).max().unwrap(),
    );
    let solid_gaps = (b0..=b1)
        .filter(|&x| !blue1.iter().any(|p| p.0 == x))
        .count();
    assert_eq!(solid_gaps, 0, "a solid line has no gaps");

    // The legend: both colours below the plot too.
    let legend_rows = |rgb| {
        (rows..img.h)
            .flat_map(|y| (0..img.w).map(move |x| (x, y)))
            .filter(|&(x, y)| img.at(x, y) == rgb)
            .count()
    };
    assert!(legend_rows(BLUE) >= 20 && legend_rows(ORANGE) >= 20);

    // The title: ink on several rows of the title line, centred.
    let title: Vec<(usize, usize)> = img
        .pixels(INK, MARGIN + CH)
        .into_iter()
        .filter(|&(x, y)| y >= MARGIN && (200..440).contains(&x))
        .collect();
    let title_rows: std::collections::BTreeSet<usize> = title.iter().map(|p| p.1).collect();
    assert!(
        title.len() > 100 && title_rows.len() >= 10,
        "title ink: {} pixels on {} rows",
        title.len(),
        title_rows.len()
    );
    // Without a title that line is blank.
    let mut untitled = plot.clone();
    untitled.title = None;
    let img2 = Image::decode(&untitled.to_png()?)?;
    assert!(img2.pixels(INK, MARGIN).is_empty());
    let frame = frame_top(&img2);
    let frame_with_title = frame_top(&img);
    assert_eq!(
        frame_with_title.0,
        frame.0 + CH + 6,
        "the title takes CH + GAP rows"
    );

    // Byte-identical on a second call.
    assert_eq!(plot.to_png()?, plot.to_png()?);
    Ok(())
}

#[test]
fn lines_are_clipped_to_the_plot_area() -> Result<()> {
    let mut plot = LinePlot::new(500, 300);
    plot.series.push(Series::new(
        "up",
        (0..=10).map(|i| (i as f64, i as f64)).collect(),
    ));
    plot.y_max = Some(5.0);
    plot.y_min = Some(0.0);
    let img = Image::decode(&plot.to_png()?)?;
    let (top, left, right) = frame_top(&img);
    let blue = img.pixels(BLUE, above_legend(img.h));
    assert!(!blue.is_empty());
    assert!(
        blue.iter().all(|&(x, y)| y > top && x > left && x < right),
        "inside the frame"
    );
    // y = x reaches y_max = 5 half-way: nothing drawn beyond about the middle.
    let max_x = blue.iter().map(|p| p.0).max().unwrap();
    let mid = (left + right) / 2;
    assert!(
        max_x.abs_diff(mid) < 10,
        "line ends at column {max_x}, middle {mid}"
    );
    // Without the cap the line crosses the whole plot.
    plot.y_max = None;
    let img = Image::decode(&plot.to_png()?)?;
    let max_x = img
        .pixels(BLUE, above_legend(img.h))
        .iter()
        .map(|p| p.0)
        .max()
        .unwrap();
    assert!(max_x > right - 30, "{max_x} vs right edge {right}");
    Ok(())
}

#[test]
fn log_scale_straightens_an_exponential() -> Result<()> {
    // y = 10^x: a straight line on a log axis, a hockey stick on a linear one.
    let pts: Vec<(f64, f64)> = (0..=40)
        .map(|i| (i as f64 / 10.0, 10f64.powf(i as f64 / 10.0)))
        .collect();
    let mut plot = LinePlot::new(500, 400);
    plot.series.push(Series::new("exp", pts));
    let mid_row_offset = |plot: &LinePlot| -> Result<f64> {
        let img = Image::decode(&plot.to_png()?)?;
        let blue = img.pixels(BLUE, above_legend(img.h));
        let (x0, x1) = (
            blue.iter().map(|p| p.0).min().unwrap(),
            blue.iter().map(|p| p.0).max().unwrap(),
        );
        let rows_at = |x: usize| mean(blue.iter().filter(|p| p.0 == x).map(|p| p.1 as f64));
        let (a, b, m) = (rows_at(x0), rows_at(x1), rows_at((x0 + x1) / 2));
        // How far the middle is from the chord between the ends, in rows (+: below it).
        Ok(m - (a + b) / 2.0)
    };
    let linear = mid_row_offset(&plot)?;
    plot.log_y = true;
    let log = mid_row_offset(&plot)?;
    assert!(
        linear > 100.0,
        "linear axis: the middle sags {linear} rows below the chord"
    );
    assert!(
        log.abs() < 4.0,
        "log axis: the middle is {log} rows off the chord"
    );
    // Non-positive values are skipped on a log axis, not errors.
    plot.series.push(Series::new(
        "zeros",
        vec![(0.0, 0.0), (1.0, -1.0), (2.0, 5.0)],
    ));
    Image::decode(&plot.to_png()?)?;
    Ok(())
}

#[test]
fn non_finite_points_are_skipped_and_degenerate_ranges_draw() -> Result<()> {
    let mut plot = LinePlot::new(400, 300);
    plot.series.push(Series::new(
        "gappy",
        vec![
            (0.0, 1.0),
            (1.0, f64::NAN),
            (2.0, f64::INFINITY),
            (f64::NAN, 3.0),
            (3.0, 2.0),
        ],
    ));
    let img = Image::decode(&plot.to_png()?)?;
    assert!(img.pixels(BLUE, above_legend(img.h)).len() > 100);
    // One point: a marker. A flat line: a horizontal line.
    let mut one = LinePlot::new(400, 300);
    one.series.push(Series::new("one", vec![(5.0, 2.0)]));
    let img = Image::decode(&one.to_png()?)?;
    assert_eq!(img.squares(BLUE, 7, above_legend(img.h)).len(), 1);
    let mut flat = LinePlot::new(400, 300);
    flat.series.push(Series::new(
        "flat",
        vec![(0.0, 2.0), (1.0, 2.0), (2.0, 2.0)],
    ));
    flat.series.push(Series::new("point", vec![(1.0, 2.0)]));
    let img = Image::decode(&flat.to_png()?)?;
    let blue = img.pixels(BLUE, above_legend(img.h));
    let rows: std::collections::BTreeSet<usize> = blue.iter().map(|p| p.1).collect();
    assert_eq!(
        rows.len(),
        2,
        "a flat line is 2 pixels thick: rows {rows:?}"
    );
    assert!(blue.len() > 300);
    assert_eq!(img.squares(ORANGE, 7, above_legend(img.h)).len(), 1);
    // Values far outside a fixed y range: clipped lines, no marker, no panic, valid SVG.
    let mut far = LinePlot::new(400, 300);
    (far.y_min, far.y_max) = (Some(0.0), Some(1.0));
    let pts = vec![(0.0, 1e308), (1.0, 0.5), (2.0, -1e308), (3.0, f64::MAX)];
    far.series.push(Series::new("far", pts).with_markers());
    let img = Image::decode(&far.to_png()?)?;
    assert_eq!(
        img.squares(BLUE, 7, above_legend(img.h)).len(),
        1,
        "only (1, 0.5)"
    );
    let svg = far.to_svg()?;
    assert!(!svg.contains("inf") && !svg.contains("NaN"));
    assert_eq!(
        svg.matches(r#"class="marker""#).count(),
        2,
        "(1, 0.5) and the legend's"
    );
    Ok(())
}

#[test]
fn svg_has_the_size_a_polyline_per_series_and_the_legend() -> Result<()> {
    let mut plot = two_series(640, 400);
    plot.series
        .push(Series::new("a<b & \"c\"", vec![(0.0, 10.0), (100.0, 12.0)]));
    let svg = plot.to_svg()?;
    let body = svg.trim_start_matches(|c| c != '\n').trim_start();
    assert!(
        svg.starts_with("<?xml") && body.starts_with("<svg"),
        "{}",
        &svg[..80]
    );
    let root = &body[..body.find('>').unwrap()];
    assert!(
        root.contains(r#"width="640""#) && root.contains(r#"height="400""#),
        "{root}"
    );
    let names: Vec<String> = xml::elements(&svg).into_iter().map(|e| e.name).collect();
    assert_eq!(names[0], "svg");
    // One <g class="series"> per series, each with a polyline in its colour.
    let groups: Vec<&str> = svg
        .split(r#"<g class="series""#)
        .skip(1)
        .map(|g| &g[..g.find("</g>").unwrap()])
        .collect();
    assert_eq!(groups.len(), 3);
    for (g, color) in groups.iter().zip(["#1f77b4", "#ff7f0e", "#2ca02c"]) {
        assert!(
            g.contains("<polyline") && g.contains(&format!(r#"stroke="{color}""#)),
            "{g}"
        );
    }
    assert!(groups[1].contains("stroke-dasharray") && !groups[0].contains("stroke-dasharray"));
    assert_eq!(groups[1].matches(r#"class="marker""#).count(), 3);
    // Legend text names every series, escaped.
    let legend = &svg[svg.find(r#"<g class="legend">"#).unwrap()..];
    for name in [
        ">up</text>",
        ">down</text>",
        ">a&lt;b &amp; &quot;c&quot;</text>",
    ] {
        assert!(legend.contains(name), "{name} not in {legend}");
    }
    assert!(svg.contains(">Rising and falling</text>") && svg.contains(">step</text>"));
    Ok(())
}

#[test]
fn errors_name_the_argument() {
    let err = |p: &LinePlot| p.to_png().unwrap_err().to_string();
    let mut p = LinePlot::new(400, 300);
    assert!(err(&p).contains("`series` is empty"), "{}", err(&p));
    p.series.push(Series::new(
        "nan",
        vec![(0.0, f64::NAN), (f64::INFINITY, 1.0)],
    ));
    assert!(
        err(&p).contains("no point of `series`") && err(&p).contains("\"nan\""),
        "{}",
        err(&p)
    );
    assert!(p
        .to_svg()
        .unwrap_err()
        .to_string()
        .contains("LinePlot::to_svg"));
    p.series
        .push(Series::new("ok", vec![(0.0, 1.0), (1.0, 2.0)]));
    assert!(p.to_png().is_ok());
    for (w, h, arg) in [
        (0, 300, "`width`"),
        (400, 0, "`height`"),
        (0, 400, "`width`"),
        (60, 400, "`width`"),
        (400, 60, "`height`"),
    ] {
        let mut q = p.clone();
        (q.width, q.height) = (w, h);
        let e = err(&q);
        assert!(e.contains(arg) && e.contains("expected"), "{w}×{h}: {e}");
    }
    let mut q = p.clone();
    (q.width, q.height) = (100_000, 100_000);
    assert!(err(&q).contains("pixel limit"), "{}", err(&q));
    let mut q = p.clone();
    q.y_min = Some(3.0);
    q.y_max = Some(1.0);
    assert!(err(&q).contains("`y_min`"), "{}", err(&q));
    q.y_min = Some(f64::NAN);
    assert!(err(&q).contains("`y_min` is NaN"), "{}", err(&q));
    let mut q = p.clone();
    q.log_y = true;
    q.series.truncate(1);
    q.series
        .push(Series::new("neg", vec![(0.0, -1.0), (1.0, 0.0)]));
    assert!(err(&q).contains("positive"), "{}", err(&q));
    q.series[1].points.push((2.0, 0.5));
    q.y_max = Some(-1.0);
    assert!(err(&q).contains("`y_max`"), "{}", err(&q));
}
