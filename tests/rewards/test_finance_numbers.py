"""Finance numbers read as an analyst reads them: a table of cases with the analyst's verdict.

Each case is (response, expected, params, verdict): verdict 1 or 0 is the score an analyst
would give; ``LOW`` marks a truly ambiguous answer, which must come back with
``confidence: "low"`` and less than full reward. The rules are in `rewards.amounts`.
"""

from __future__ import annotations

import pytest

LOW = "low"
PCT_FRACTION = {"percent": "fraction"}
PCT_NUMBER = {"percent": "number"}

NUMERIC = [
    # accounting negatives
    ("Net loss: (1,234)", -1234, {}, 1),
    ("Net loss: (1,234)", 1234, {}, 0),
    ("The adjustment was $(2.5) million.", -2_500_000, {}, 1),
    ("The adjustment was $(2.5) million.", 2_500_000, {}, 0),
    ("Operating margin came in at (12.5%).", -0.125, {}, 1),
    ("Operating margin came in at (12.5%).", 0.125, {}, 0),
    ("Free cash flow was ($3.4m) for the quarter.", -3_400_000, {}, 1),
    ("| Net income | (45) |", -45, {}, 1),
    # a minus before the currency, in running prose
    ("The company burned -$500k in the quarter.", -500_000, {}, 1),
    ("The company burned -$500k in the quarter.", 500_000, {}, 0),
    ("Goodwill was written down by –€3.2bn.", -3.2e9, {}, 1),
    ("The FX impact was −$5 per share.", -5, {}, 1),
    ("Answer: −£1.1 billion", -1.1e9, {}, 1),
    # scale words and abbreviations
    ("Revenue reached $45k.", 45_000, {}, 1),
    ("Revenue reached 45K.", 45_000, {}, 1),
    ("Revenue reached 45 thousand dollars.", 45_000, {}, 1),
    ("Backlog stands at $1.2m.", 1_200_000, {}, 1),
    ("Backlog stands at 1.2M.", 1_200_000, {}, 1),
    ("Backlog stands at $1.2mm.", 1_200_000, {}, 1),
    ("Backlog stands at 1.2 MM.", 1_200_000, {}, 1),
    ("Backlog stands at €1.2mn.", 1_200_000, {}, 1),
    ("Backlog stands at 1.2 million.", 1_200_000, {}, 1),
    ("Market cap is $3.5b.", 3.5e9, {}, 1),
    ("Market cap is 3.5bn.", 3.5e9, {}, 1),
    ("Market cap is $3.5B.", 3.5e9, {}, 1),
    ("Market cap is 3.5 billion.", 3.5e9, {}, 1),
    ("Assets under management: $2.1tn.", 2.1e12, {}, 1),
    ("Assets under management: $2.1t.", 2.1e12, {}, 1),
    ("Assets under management: 2.1 trillion.", 2.1e12, {}, 1),
    ("Backlog stands at $1.2m.", 1_200, {}, 0),
    # basis points, percentages and fractions
    ("The Fed raised rates by 50 bps.", 0.005, {}, 1),
    ("The Fed raised rates by 50 bps.", "0.5%", {}, 1),
    ("The Fed raised rates by 50 basis points.", 0.005, PCT_FRACTION, 1),
    ("The Fed raised rates by 50 bps.", 50, {}, 0),
    ("Yield: 3.5%", 0.035, {}, 1),
    ("Yield: 3.5%", 3.5, {}, 1),
    ("Yield: 3.5%", 0.035, PCT_FRACTION, 1),
    ("Yield: 3.5%", 3.5, PCT_FRACTION, 0),
    ("Yield: 3.5%", 3.5, PCT_NUMBER, 1),
    ("Yield: 3.5%", 0.035, PCT_NUMBER, 0),
    ("Yield: 0.035", "3.5%", PCT_FRACTION, 1),
    ("Yield: 3.5 percent", "3.5%", {}, 1),
    # the number that answers is not the last number
    ("Revenue was $5.2 billion in 2023.", 5.2e9, {}, 1),
    ("Revenue was $5.2 billion in 2023.", 2023, {}, 0),
    ("In FY2023, net income was $812m.", 812e6, {}, 1),
    ("Net income was $812m in FY 2023.", 812e6, {}, 1),
    ("EBITDA margin was 18.4% in Q3 2024.", 0.184, {}, 1),
    ("Diluted EPS was $2.15.[3]", 2.15, {}, 1),
    ("Diluted EPS was $2.15 ^4", 2.15, {}, 1),
    ("Capex was $310m (see page 14).", 310e6, {}, 1),
    ("Capex was $310m, per Note 7 and p. 42.", 310e6, {}, 1),
    ("Cash was $1.9bn as of March 31, 2024.", 1.9e9, {}, 1),
    ("Cash was $1.9bn as of 12/31/2023.", 1.9e9, {}, 1),
    ("Growth came from 3Q24 orders: revenue was $40m.", 40e6, {}, 1),
    ("The answer is $7.5m, up from $6.1m in 2022.", 7.5e6, {}, 1),
    ("First I estimated $12m, then revised it to $15m.", 15e6, {}, 1),
    ("The company was founded in 1998.", 1998, {}, 1),
    ("Answer: 42 (FY2024, page 3)", 42, {}, 1),
    ("1H24 revenue of $3bn", 3e9, {}, 1),
    ("Q4'23 margin of 12%", 0.12, {}, 1),
    ("COVID-19 costs were $3m", 3e6, {}, 1),
    ("Revenue of $1,234.5 million", 1_234_500_000, {}, 1),
    ("Proceeds of EUR1.2m", 1_200_000, {}, 1),
    ("Diluted EPS of $(0.12)", -0.12, {}, 1),
    # truly ambiguous: low confidence, never full reward
    ("Answer: $1.2–1.5 billion", 1.2e9, {}, LOW),
    ("Answer: 12 or 15", 12, {}, LOW),
    ("The tower is 5 m tall.", 5, {}, LOW),
    ("Growth should be 5-7% next year.", 0.07, {}, LOW),
    # ... unless the rubric says how its domain writes short scales
    ("The tower is 5 m tall.", 5, {"short_scales": "never"}, 1),
    ("The tower is 5m tall.", 5, {"short_scales": "never"}, 1),
    ("Sales were 5 m units.", 5_000_000, {"short_scales": "always"}, 1),
    # existing behaviour
    ("Net income was $1.2m", 1_200_000, {"rel_tol": 0.001}, 1),
    ("Growth: 3.14159", 3.1416, {"abs_tol": 0.0001}, 1),
    (r"\boxed{\frac{7}{8}}", 0.875, {}, 1),
    ("The result is 1e-3", 0.001, {}, 1),
    ("#### -0.5", -0.5, {}, 1),
    ("No number here", 1, {}, 0),
]


@pytest.mark.parametrize(("response", "expected", "params", "verdict"), NUMERIC)
def test_numeric_match_reads_numbers_as_an_analyst(scorer, response, expected, params, verdict):
    score, details = scorer("numeric_match", params)(response, expected)
    if verdict == LOW:
        assert details.get("confidence") == "low", details
        assert score < 1.0
    else:
        assert score == verdict, details
        assert "confidence" not in details


REPORT = """## FY2024 results

Revenue for the year was $1.20 billion, up 15% from FY2023 (see page 4). Net income was
$(45) million after a $60m impairment.[2]

| Segment | FY2023 | FY2024 |
|---|---|---|
| Americas | 600 | 700 |
| EMEA | 300 | 350 |
| APAC | 150 | 190 |
| Eliminations | (30) | (40) |
| Total revenue | 1,020 | 1,200 |

Operating margin improved by 120 bps to 8.5%. Free cash flow was -$80m.
"""


@pytest.mark.parametrize(
    ("label", "expected", "verdict"),
    [
        ("Revenue", 1.2e9, 1),
        ("Net income", -45e6, 1),
        ("Net income", 45e6, 0),
        ("Eliminations", -40, 1),
        ("Total revenue", 1200, 1),
        ("Free cash flow", -80e6, 1),
        ("Operating margin", "8.5%", 1),
        ("APAC", 190, 1),
    ],
)
def test_labelled_values_in_a_financial_report(scorer, label, expected, verdict):
    score, details = scorer("labelled_values", {"values": {label: expected}})(REPORT)
    assert score == verdict, details


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Revenue grew 15% to $5.0m.", 5e6),
        ("Revenue in 2023 was $4.1m.", 4.1e6),
        ("Revenue (FY2024, see p. 7): 812 mn", 812e6),
        ("Revenue was 5 m.", 5e6),  # next to a label, a figure
        ("Revenue: –$0.3bn after restatement", -0.3e9),
    ],
)
def test_labelled_values_pass_over_growth_rates_years_and_references(scorer, text, expected):
    score, details = scorer("labelled_values", {"values": {"Revenue": expected}})(text)
    assert score == 1.0, details


def test_labelled_values_tell_a_label_from_a_longer_one(scorer):
    text = "Product revenue was $40m. Service revenue was $10m. Revenue was $50m."
    score, details = scorer(
        "labelled_values",
        {"values": {"Revenue": 50e6, "Product revenue": 40e6, "Service revenue": 10e6}},
    )(text)
    assert score == 1.0, details


def test_a_total_must_equal_the_sum_of_its_parts(scorer):
    totals = {"totals": [
        {"total": "Total revenue", "parts": ["Americas", "EMEA", "APAC", "Eliminations"]}
    ]}  # fmt: skip
    score = scorer("consistency", totals)
    assert score(REPORT)[0] == 1.0
    broken, details = score(REPORT.replace("| Total revenue | 1,020 | 1,200 |",
                                           "| Total revenue | 1,020 | 1,240 |"))  # fmt: skip
    assert broken == 0.0
    assert details["totals"][0]["sum_of_parts"] == 1200
    assert details["totals"][0]["stated_total"] == 1240


def test_parts_and_total_stated_in_different_paragraphs(scorer):
    text = (
        "Product revenue was $40.0m in the year.\n\n"
        "Services brought in more: service revenue was $12.5m.\n\n"
        "In all, consolidated revenue reached $52.5m.\n"
    )
    spec = {"totals": [
        {"total": "consolidated revenue", "parts": ["Product revenue", "service revenue"]}
    ]}  # fmt: skip
    assert scorer("consistency", spec)(text)[0] == 1.0
    assert scorer("consistency", spec)(text.replace("$52.5m", "$55.0m"))[0] == 0.0
    within = {"totals": [{**spec["totals"][0], "abs_tol": 3e6}]}
    assert scorer("consistency", within)(text.replace("$52.5m", "$55.0m"))[0] == 1.0


def test_a_total_whose_parts_are_not_all_stated(scorer):
    spec = {"totals": [{"total": "Total revenue", "parts": ["Americas", "LATAM"]}]}
    lenient, details = scorer("consistency", spec)(REPORT)
    assert (lenient, details["totals"][0]["missing"]) == (1.0, ["LATAM"])
    assert scorer("consistency", {**spec, "require_all": True})(REPORT)[0] == 0.0


def test_labels_and_totals_score_together(scorer):
    spec = {
        "labels": ["Revenue"],
        "totals": [{"total": "Total revenue", "parts": ["Americas", "EMEA", "APAC"]}],
    }
    score, details = scorer("consistency", spec)(REPORT)
    # Revenue is stated once in prose; the parts without eliminations do not add up.
    assert score == 0.5, details


def test_the_table_has_at_least_sixty_cases():
    assert len(NUMERIC) >= 60
