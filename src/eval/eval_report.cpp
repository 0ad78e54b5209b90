// `spin eval`'s report.md, rendered from the typed results (eval_internal.h): one renderer per
// section, in the order the report reads.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "eval/eval_internal.h"

namespace spin::eval_internal {

namespace {

std::string cell(double v, const char* format = "{:.3f}") {
  return std::isfinite(v) ? fmt::format(fmt::runtime(format), v) : "–";
}
std::string cell(const std::optional<double>& v) { return v ? cell(*v) : std::string("–"); }
// A percentage of a value that may be undefined: NaN (printed "nan") for any non-finite value.
double percent(double v) { return 100 * (std::isfinite(v) ? v : NAN); }

std::string render_calibration(const std::vector<CalibrationRow>& calibration) {
  std::string md = "## Calibration (all-keep, prev-iter open loop)\n\n| scenario | visible entries | Pearson | target | top-k "
                   "recall | target | blocks with ≥1 top-k entry |\n|---|---:|---:|---:|---:|---:|---:|\n";
  for (const CalibrationRow& c : calibration) {
    md += fmt::format("| {} | {:.0f} | {} | {} | {} | {} | {:.1f}% |\n", c.scenario, c.mean_visible_entries,
                      cell(c.pearson), cell(c.target_pearson), cell(c.topk_recall), cell(c.target_topk_recall),
                      100 * c.topk_block_share);
  }
  return md;
}

std::string render_predictors(const std::vector<QualityRow>& predictors) {
  std::string md =
      fmt::format("\n## Predictor comparison (open loop, block recall at {:.0f}% sparsity)\n\n", 100 * kComparisonSparsity);
  md += "| scenario | predictor | Pearson | block recall | top-k recall (token) |\n|---|---|---:|---:|---:|\n";
  for (const QualityRow& r : predictors) {
    md += fmt::format("| {} | {} | {} | {} | {} |\n", r.scenario, r.label, cell(r.pearson_mean), cell(r.block_recall_mean),
                      cell(r.topk_recall_mean));
  }
  return md;
}

// The labels of `rows` in the order they first appear.
template <typename Row>
std::vector<std::string> label_order(const std::vector<Row>& rows) {
  std::vector<std::string> order;
  for (const Row& r : rows)
    if (std::find(order.begin(), order.end(), r.label) == order.end()) order.push_back(r.label);
  return order;
}

// A table header: "| predictor | <column 1> | ... |" and its rule.
std::string table_head(const std::vector<double>& columns, const char* format) {
  std::string md = "| predictor |";
  std::string rule = "|---|";
  for (double c : columns) {
    md += fmt::format(fmt::runtime(format), 100 * c);
    rule += "---:|";
  }
  return md + "\n" + rule + "\n";
}

// One table per scenario: a row per predictor, a column per target sparsity.
std::string render_sweep_tables(const std::vector<QualityRow>& sweep, const std::vector<double>& sparsities) {
  std::string md;
  std::map<std::string, std::map<std::string, std::map<double, const QualityRow*>>> grid;
  for (const QualityRow& r : sweep) grid[r.scenario][r.label][r.target_sparsity] = &r;
  const std::vector<std::string> order = label_order(sweep);
  for (const auto& [scenario, by_label] : grid) {
    md += "### " + scenario + "\n\n" + table_head(sparsities, " {:.0f}% |");
    for (const std::string& label : order) {
      if (!by_label.count(label)) continue;
      md += "| " + label + " |";
      for (double s : sparsities) {
        const QualityRow* r = by_label.at(label).count(s) ? by_label.at(label).at(s) : nullptr;
        if (r == nullptr) {
          md += " – |";
          continue;
        }
        md += fmt::format(" {} / {} ({:.0f}%) |", cell(r->recall_mean), cell(r->miss_p99), percent(r->sparsity_mean));
      }
      md += "\n";
    }
    md += "\n";
  }
  return md;
}

std::string render_sweep(const std::vector<QualityRow>& sweep, bool quick) {
  return "\n## Sparsity sweep (closed loop): mean recall / p99 miss, realised sparsity in brackets\n\n" +
         render_sweep_tables(sweep, sweep_sparsities(quick));
}

std::string render_equal_cost(const std::vector<EqualCostRow>& equal_cost, const std::vector<QualityRow>& sweep_order) {
  std::string md =
      "\n## At equal cost (closed loop): mean recall / p99 miss at the same indexer work\n\n"
      "Work = (fine entries scored + probe work) / the full indexer's entries; the probe (hisa, spin-hybrid) "
      "scores one pooled key per block with the query, heads·128 multiply-adds: one entry's worth. Read off "
      "each predictor's sweep, linear between its two nearest points (– where the sweep does not reach "
      "that cost: indexcache never costs less than its full layers). Select/observe time, measured, is in "
      "results.json timing.overhead_fraction (spin ≈ 1–2 % of the indexer on this CPU: pooling each scored "
      "entry's score) and not added here, so that the table is deterministic.\n\n";
  const std::vector<std::string> order = label_order(sweep_order);
  std::map<std::string, std::map<std::string, std::map<double, const EqualCostRow*>>> grid;
  for (const EqualCostRow& r : equal_cost) grid[r.scenario][r.label][r.work_fraction] = &r;
  for (const auto& [scenario, by_label] : grid) {
    md += "### " + scenario + "\n\n" + table_head(equal_cost_levels(), " work {:.0f}% |");
    for (const std::string& label : order) {
      if (!by_label.count(label) || label == "random") continue;
      md += "| " + label + " |";
      for (double c : equal_cost_levels()) {
        const EqualCostRow& r = *by_label.at(label).at(c);
        md += fmt::format(" {} / {} |", cell(r.recall_mean), cell(r.miss_p99));
      }
      md += "\n";
    }
    md += "\n";
  }
  return md;
}

std::string render_beyond(const std::vector<QualityRow>& beyond) {
  if (beyond.empty()) return "";
  std::string md = fmt::format(
      "\n## Ablation: spin-hybrid's probe and the budget moves ({:.0f}% target sparsity, closed loop)\n\n"
      "| scenario | variant | mean recall | p99 miss | work fraction | probe part |\n|---|---|---:|---:|---:|---:|\n",
      100 * kMtpSparsity);
  for (const QualityRow& r : beyond) {
    md += fmt::format("| {} | {} | {} | {} | {} | {} |\n", r.scenario, r.label, cell(r.recall_mean), cell(r.miss_p99),
                      cell(r.work_fraction), cell(r.probe_fraction, "{:.4f}"));
  }
  return md;
}

// Rows come in pairs: each update mode at 30 % and at kMtpSparsity (the job table's order).
std::string render_mtp(const std::vector<QualityRow>& mtp) {
  std::string md = fmt::format(
      "## MTP replay (spin; closed loop): mean recall / p99 miss\n\n| scenario | update | 30% | {:.0f}% |\n|---|---|---:|---:|\n",
      100 * kMtpSparsity);
  for (size_t i = 0; i + 1 < mtp.size(); i += 2) {
    md += fmt::format("| {} | {} | {} / {} | {} / {} |\n", mtp[i].scenario, mtp[i].label, cell(mtp[i].recall_mean),
                      cell(mtp[i].miss_p99), cell(mtp[i + 1].recall_mean), cell(mtp[i + 1].miss_p99));
  }
  return md;
}

std::string render_pooling(const std::vector<QualityRow>& pooling) {
  std::string md = fmt::format(
      "\n## Ablation: pooling and combine (spin, {:.0f}% sparsity, closed loop)\n\n| scenario | variant | mean recall | "
      "p99 miss | block recall |\n|---|---|---:|---:|---:|\n",
      100 * kMtpSparsity);
  for (const QualityRow& r : pooling) {
    md += fmt::format("| {} | {} | {} | {} | {} |\n", r.scenario, r.label, cell(r.recall_mean), cell(r.miss_p99),
                      cell(r.block_recall_mean));
  }
  return md;
}

std::string range_cell(const LayerRange& r) { return fmt::format("{} ({}–{})", cell(r.mean), cell(r.min), cell(r.max)); }

// One real trace at one top-k: its all-keep statistics beside the generator's, then its tables.
std::string render_real_trace(const RealModelResult& r, bool quick) {
  std::string md = fmt::format("### {} — {} ({}, {} trace), top-k {}\n\n", r.label, r.model, r.source,
                               r.kind == "keys" ? "key" : "score", r.topk);
  md += "All-keep statistics, mean (min–max over layers), beside the generator's doc-qa-10k at the same context, "
        "steps and top-k:\n\n| statistic | real | synthetic |\n|---|---:|---:|\n";
  const LayerStats& a = r.all_keep;
  const LayerStats& syn = r.synthetic;
  md += fmt::format("| {} | {} | {} |\n", "prev-iter top-k recall", range_cell(a.prev_step_topk_recall),
                    range_cell(syn.prev_step_topk_recall));
  md += fmt::format("| {} | {} | {} |\n", "Pearson of consecutive block scores (max-pooled)",
                    range_cell(a.prev_step_block_pearson), range_cell(syn.prev_step_block_pearson));
  md += fmt::format("| {} | {} | {} |\n", "blocks holding ≥ 1 top-k entry", range_cell(a.topk_block_share),
                    range_cell(syn.topk_block_share));
  md += "\n<details><summary>per layer</summary>\n\n| layer | prev-iter top-k recall | block Pearson | blocks with ≥ 1 "
        "top-k |\n|---:|---:|---:|---:|\n";
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const TraceFacts& f = a.layers[l];
    md += fmt::format("| {} | {} | {} | {} |\n", l, cell(f.prev_step_topk_recall), cell(f.prev_step_block_pearson),
                      cell(f.topk_block_share));
  }
  md += "\n</details>\n\nClosed loop, mean recall / p99 miss (realised sparsity):\n\n";
  md += render_sweep_tables(r.sweep, real_sparsities(quick));
  if (!r.mtp.empty()) md += render_mtp(r.mtp) + "\n";
  return md;
}

// The real-model section: what the traces are, per-layer statistics, real vs synthetic, sweeps.
std::string render_real(const std::vector<RealModelResult>& real, bool quick) {
  if (real.empty()) return "";
  std::string md = "\n## Real model\n\n";
  md += "Real traces of a small pretrained language model over a real text (`./scripts/record-real-traces.sh`, "
        "recorder/README.md). A **score trace** holds the model's **attention scores**, not a DSA indexer's: the "
        "closest real signal (DSA trains its indexer to match the head-summed attention). A **key trace** holds the "
        "keys and queries of a **lightning indexer distilled** for the model that way, which spin's indexer scores. "
        "Each is read at its own top-k and at a second one (scaled to the context as 2048 of 64K, or DSA's "
        "2048).\n\n";
  for (const RealModelResult& r : real) md += render_real_trace(r, quick);
  return md;
}

// What each recorded trace is, and the predictors it could not feed.
std::string render_recorded_traces(const std::map<std::string, ScenarioFacts>& scenarios) {
  std::string md;
  for (const auto& [name, sc] : scenarios) {
    if (sc.workload.rfind("recorded trace", 0) != 0) continue;
    md += fmt::format("Trace `{}`: {}.", name, sc.workload);
    if (!sc.skipped_predictors.empty()) {
      std::string list;
      for (const std::string& p : sc.skipped_predictors) list += (list.empty() ? "" : ", ") + p;
      md += fmt::format(" Not run on it: {} (they need the indexer's keys and queries, or a block probe at their "
                        "block size, which this score trace lacks; or a geometry this trace does not have).", list);
    }
    md += "\n\n";
  }
  return md;
}

}  // namespace

std::string render_report(const EvalOptions& o, int requests, const Results& res) {
  std::string md = "# spin eval report\n\n";
  if (res.verdict) md += advice_markdown(*res.verdict);
  md += fmt::format("Seed {}, {} request(s) per scenario{}. Predictor config (sweeps vary target_sparsity): `{}`\n\n", o.seed, requests,
                    o.quick ? ", quick mode" : "", o.base_config.to_string());
  md += "Every number is measured against all-keep (the full indexer) on the same trace; recall is token-level "
        "top-k recall, miss = 1 − recall, percentiles are nearest-rank. Rows whose context holds ≤ topk entries are "
        "exact by construction and excluded (counted in results.json). Prefills are observations, not samples: step 0 of "
        "each trace and every step whose ctx_len grows by more than its rows (a tool output, a new turn) are observed "
        "in full by every predictor (prefill computed those scores anyway), the same for every MTP update mode.\n\n";
  md += render_recorded_traces(res.scenarios);
  md += render_calibration(res.calibration);
  md += render_predictors(res.predictors);
  md += render_sweep(res.sweep, o.quick);
  md += render_equal_cost(res.equal_cost, res.sweep);
  md += render_mtp(res.mtp);
  md += render_pooling(res.pooling);
  md += render_beyond(res.beyond);
  md += render_real(res.real_model, o.quick);
  return md;
}

}  // namespace spin::eval_internal
