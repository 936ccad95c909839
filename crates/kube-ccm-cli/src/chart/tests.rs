use super::*;

fn chart() -> Chart {
    Chart {
        title: "a <migration> & more".to_owned(),
        start_us: 0,
        end_us: 10_000_000,
        leases: vec!["kube-controller-manager".to_owned(), "migration".to_owned()],
        bars: vec![
            Bar {
                lease: "migration".to_owned(),
                holder: "kcm-1".to_owned(),
                component: Some("kube-controller-manager".to_owned()),
                start_us: 0,
                end_us: Some(4_000_000),
            },
            Bar {
                lease: "migration".to_owned(),
                holder: "ccm-1".to_owned(),
                component: Some("cloud-controller-manager".to_owned()),
                start_us: 4_002_000,
                end_us: None,
            },
        ],
        gaps: vec![Gap {
            lease: "migration".to_owned(),
            to: "ccm-1".to_owned(),
            at_us: 4_002_000,
            gap_ms: 2.0,
            released: true,
        }],
        marks: vec![Mark {
            at_us: 3_900_000,
            label: "kcm-1 stopped (SIGTERM)".to_owned(),
        }],
        footer: vec![(Tone::Good, "verdict: ok".to_owned())],
        clock: false,
    }
}

#[test]
fn every_tenure_gap_and_mark_is_drawn_with_its_description() {
    let svg = chart().to_svg();
    assert!(svg.starts_with("<svg "), "{svg}");
    assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
    assert_eq!(svg.matches(r#"class="tenure""#).count(), 2, "{svg}");
    assert!(svg.contains(r#"data-holder="kcm-1" data-component="kube-controller-manager" data-start-us="0" data-end-us="4000000""#), "{svg}");
    assert!(svg.contains(r#"data-holder="ccm-1" data-component="cloud-controller-manager" data-start-us="4002000" data-end-us="open""#), "{svg}");
    assert!(
        svg.contains(r#"data-to="ccm-1" data-gap-ms="2.0" data-how="released""#),
        "{svg}"
    );
    assert!(
        svg.contains(r#"data-label="kcm-1 stopped (SIGTERM)" data-at-us="3900000""#),
        "{svg}"
    );
    assert!(svg.contains(">verdict: ok</text>"), "{svg}");
    // A Lease nobody held is still a band, and says so.
    assert!(
        svg.contains(r#"data-lease="kube-controller-manager">Lease kube-controller-manager"#),
        "{svg}"
    );
    assert!(svg.contains("never held"), "{svg}");
}

#[test]
fn text_is_escaped() {
    let svg = chart().to_svg();
    assert!(svg.contains("a &lt;migration&gt; &amp; more"), "{svg}");
    assert!(!svg.contains("<migration>"), "{svg}");
}

#[test]
fn long_holder_names_are_shortened_in_the_labels_only() {
    assert_eq!(shorten("kcm-1", 40), "kcm-1");
    let long = "control-plane-1_0f8e9a8c-1d2e-4c6b-9a57-3a1f2b7c9d10";
    let short = shorten(long, 40);
    assert_eq!(short.chars().count(), 40);
    assert!(short.ends_with('…'));
    let mut chart = chart();
    chart.bars[0].holder = long.to_owned();
    let svg = chart.to_svg();
    assert!(svg.contains(&format!(r#"data-holder="{long}""#)), "{svg}");
    assert!(svg.contains(&format!(">{short}<title>{long}</title>")), "{svg}");
}

#[test]
fn bands_rows_axis_and_footer_are_placed_before_anything_is_drawn() {
    let layout = chart().layout();
    assert_eq!(
        layout.bands,
        [
            Band {
                lease: "kube-controller-manager".to_owned(),
                top: TOP,
                never_held: Some(TOP + BAND_HEADER),
                rows: Vec::new(),
            },
            Band {
                lease: "migration".to_owned(),
                top: TOP + BAND_HEADER + ROW,
                never_held: None,
                rows: vec![
                    ("kcm-1".to_owned(), TOP + 2.0 * BAND_HEADER + ROW),
                    ("ccm-1".to_owned(), TOP + 2.0 * BAND_HEADER + 2.0 * ROW),
                ],
            },
        ]
    );
    assert_eq!(layout.rows_at.len(), 2);
    assert_eq!(
        layout.rows_at[&("migration".to_owned(), "ccm-1".to_owned())],
        TOP + 2.0 * BAND_HEADER + 2.0 * ROW
    );
    // Two band headers and three rows (one of them "never held"), then the axis, then the footer.
    assert_eq!(layout.bottom, TOP + 2.0 * BAND_HEADER + 3.0 * ROW);
    assert_eq!(layout.footer_top, layout.bottom + 40.0);
    assert_eq!(layout.height, layout.footer_top + 2.0 * LINE + 10.0);
}

#[test]
fn gaps_are_labelled_in_milliseconds_below_a_second() {
    assert_eq!(gap_label(2.0), "2 ms");
    assert_eq!(gap_label(999.0), "999 ms");
    assert_eq!(gap_label(1500.0), "1.5 s");
}

#[test]
fn bars_sit_on_the_time_axis() {
    let chart = chart();
    assert_eq!(chart.x(0), LABEL_WIDTH);
    assert_eq!(chart.x(10_000_000), WIDTH - RIGHT);
    assert_eq!(chart.x(20_000_000), WIDTH - RIGHT, "clamped to the axis");
    let half = chart.x(5_000_000);
    assert!((half - (LABEL_WIDTH + (WIDTH - LABEL_WIDTH - RIGHT) / 2.0)).abs() < 1e-9);
}

#[test]
fn ticks_are_round_numbers() {
    assert_eq!(tick_step(10.0), 1.0);
    assert_eq!(tick_step(35.0), 5.0);
    assert_eq!(tick_step(120.0), 20.0);
    assert!((tick_step(0.5) - 0.05).abs() < 1e-12);
}
