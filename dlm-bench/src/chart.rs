//! The chart (`--svg FILE`): for each scenario (nodes, threads) that has a minimal client
//! row, every other system's cycles/s as a ratio to it, a bar per system, with the
//! lowest and highest ratio between rounds run side by side as whiskers. Drawn with
//! plotters' SVG backend alone (no font or image libraries: text is left to the viewer).

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{Row, minimal_name, minimal_of, round_range};

const WIDTH: u32 = 1000;
/// Room for the system names left of the bars.
const LABEL_WIDTH: u32 = 270;
/// Pixels per slot (a bar or a group's heading).
const SLOT: u32 = 20;
/// Above and below the slots: caption, axis, its description.
const FRAME: u32 = 110;
/// The axis ends at most here: a wider round-to-round range is cut at the edge (its
/// figures are written beside the bar).
const CAP: f64 = 2.0;

struct Bar {
    label: String,
    ratio: f64,
    range: Option<(f64, f64)>,
}

struct Group {
    title: String,
    bars: Vec<Bar>,
}

/// The groups, in the order of the rows: one per scenario, nodes and threads with a
/// minimal client row, holding every other system of it.
fn groups(rows: &[Row]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let mut keys: Vec<(&str, &str, usize, usize)> = Vec::new();
    for r in rows.iter().filter(|r| r.system != minimal_name(&r.system)) {
        let Some(min) = minimal_of(rows, r) else {
            continue;
        };
        let (Some(v), Some(b)) = (r.cycles_per_sec, min.cycles_per_sec) else {
            continue;
        };
        if b <= 0.0 {
            continue;
        }
        let key = (min.system.as_str(), r.scenario, r.nodes, r.threads);
        let k = match keys.iter().position(|k| *k == key) {
            Some(k) => k,
            None => {
                keys.push(key);
                groups.push(Group {
                    title: format!(
                        "{}{}, {} node{}, {} thread{}",
                        match min.system.as_str() {
                            crate::report::MINIMAL_ETCD => "etcd: ",
                            crate::report::MINIMAL_POSTGRES => "postgres: ",
                            _ => "",
                        },
                        r.scenario,
                        r.nodes,
                        if r.nodes == 1 { "" } else { "s" },
                        r.threads,
                        if r.threads == 1 { "" } else { "s" },
                    ),
                    bars: Vec::new(),
                });
                groups.len() - 1
            }
        };
        groups[k].bars.push(Bar {
            label: r.system.clone(),
            ratio: v / b,
            range: round_range(&r.round_rates, &min.round_rates),
        });
    }
    groups
}

fn color(label: &str) -> RGBColor {
    if label.starts_with("dlm") {
        RGBColor(31, 119, 180)
    } else if label.starts_with("minimal") {
        RGBColor(150, 150, 150)
    } else {
        RGBColor(255, 127, 14)
    }
}

/// The chart of `rows` as an SVG document, titled `caption`.
pub fn svg(rows: &[Row], caption: &str) -> String {
    let groups = groups(rows);
    let slots: usize = groups
        .iter()
        .map(|g| g.bars.len() + 1)
        .sum::<usize>()
        .max(1);
    let bars = || groups.iter().flat_map(|g| &g.bars);
    let top = bars()
        .map(|b| b.range.map_or(b.ratio, |(_, hi)| hi.min(CAP).max(b.ratio)))
        .fold(1.2_f64, f64::max);
    // Room on the right for the figures (a range cut at `top` ends without a cap).
    let x_max = (top * 1.3 * 4.0).ceil() / 4.0;
    let height = FRAME + SLOT * slots as u32;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).expect("draw");
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 15))
            .margin(12)
            .margin_left(LABEL_WIDTH)
            .margin_right(40)
            .x_label_area_size(40)
            .build_cartesian_2d(0f64..x_max, 0f64..slots as f64)
            .expect("draw");
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .light_line_style(TRANSPARENT)
            .x_labels((x_max * 4.0) as usize + 1)
            .x_label_formatter(&|v| format!("{v:.2}x"))
            .x_desc("cycles/s as a ratio to the minimal client of the same run; whiskers: the lowest and highest ratio between rounds")
            .draw()
            .expect("draw");
        // The minimal client.
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(1.0, 0.0), (1.0, slots as f64)],
                BLACK.stroke_width(1),
            )))
            .expect("draw");
        let name_style = ("sans-serif", 12)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Right, VPos::Center));
        let value_style = ("sans-serif", 11)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center));
        let heading_style = ("sans-serif", 13)
            .into_font()
            .style(FontStyle::Bold)
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center));
        let mut slot = 0usize;
        // Slot k (from the top) is centred at y = slots - k - 0.5.
        let y_of = |k: usize| slots as f64 - k as f64 - 0.5;
        for g in &groups {
            let (_, py) = chart.backend_coord(&(0.0, y_of(slot)));
            root.draw(&Text::new(g.title.clone(), (12, py), heading_style.clone()))
                .expect("draw");
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(0.0, y_of(slot) + 0.5), (x_max, y_of(slot) + 0.5)],
                    RGBColor(220, 220, 220).stroke_width(1),
                )))
                .expect("draw");
            slot += 1;
            for b in &g.bars {
                let y = y_of(slot);
                let c = color(&b.label);
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(0.0, y - 0.32), (b.ratio, y + 0.32)],
                        c.mix(0.85).filled(),
                    )))
                    .expect("draw");
                let mut right = b.ratio;
                let mut figures = format!("{:.2}x", b.ratio);
                if let Some((lo, hi)) = b.range {
                    figures.push_str(&format!("  ({lo:.2}-{hi:.2})"));
                    let end = hi.min(top);
                    right = right.max(end);
                    let mut whiskers = vec![
                        vec![(lo, y), (end, y)],
                        vec![(lo, y - 0.22), (lo, y + 0.22)],
                    ];
                    if hi <= top {
                        whiskers.push(vec![(hi, y - 0.22), (hi, y + 0.22)]);
                    }
                    chart
                        .draw_series(
                            whiskers
                                .into_iter()
                                .map(|p| PathElement::new(p, BLACK.stroke_width(1))),
                        )
                        .expect("draw");
                }
                chart
                    .draw_series(std::iter::once(Text::new(
                        figures,
                        (right + x_max * 0.01, y),
                        value_style.clone(),
                    )))
                    .expect("draw");
                let (px, py) = chart.backend_coord(&(0.0, y));
                root.draw(&Text::new(
                    b.label.clone(),
                    (px - 8, py),
                    name_style.clone(),
                ))
                .expect("draw");
                slot += 1;
            }
        }
        root.present().expect("draw");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &str, threads: usize, cps: f64, rounds: &[f64]) -> Row {
        Row {
            system: system.to_owned(),
            scenario: "uncontended",
            nodes: 1,
            threads,
            cycles_per_sec: Some(cps),
            round_rates: rounds.to_vec(),
            ..Row::default()
        }
    }

    #[test]
    fn ratios_to_the_minimal_client_with_their_round_range() {
        let rows = [
            row("minimal", 1, 100.0, &[100.0, 100.0]),
            row("dlm", 1, 90.0, &[80.0, 100.0]),
            row("dlm (memory)", 8, 5.0, &[5.0, 5.0]), // no minimal row: left out
        ];
        let g = groups(&rows);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].title, "uncontended, 1 node, 1 thread");
        assert_eq!(g[0].bars.len(), 1);
        assert!((g[0].bars[0].ratio - 0.9).abs() < 1e-9);
        assert_eq!(g[0].bars[0].range, Some((0.8, 1.0)));
        let svg = svg(&rows, "test");
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(
            svg.contains("\ndlm\n") && svg.contains("\n0.90x  (0.80-1.00)\n"),
            "{svg}"
        );
        assert!(!svg.contains("dlm (memory)"));
    }
}
