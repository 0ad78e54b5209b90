// Sweep plots from results.json (see plots.h).
#include "plots.h"

#include <cctype>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "spin/files.h"

namespace spin::cli {
namespace {

using json = nlohmann::json;
using Points = std::vector<std::array<double, 4>>;  // sparsity, recall, p99 miss, work fraction

// Each compared predictor keeps one look in every panel and every plot: colour, dash, point.
std::string style(const std::string& label, size_t other_index) {
  static const std::map<std::string, std::string> kStyles = {
      {"spin", "lc rgb '#d62728' lw 2.5 dt 1 pt 7"},
      {"spin-hybrid", "lc rgb '#9467bd' lw 2 dt 1 pt 5"},
      {"hisa", "lc rgb '#1f77b4' lw 1.5 dt 2 pt 9"},
      {"step-reuse", "lc rgb '#2ca02c' lw 1.5 dt 3 pt 11"},
      {"prev-iter", "lc rgb '#ff7f0e' lw 1.5 dt 4 pt 13"},
      {"oracle", "lc rgb '#000000' lw 1 dt 5 pt 1"}};
  if (const auto it = kStyles.find(label); it != kStyles.end()) return it->second;
  static const std::array<const char*, 6> kOthers = {"#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
                                                     "#17becf", "#aec7e8"};
  return fmt::format("lc rgb '{}' lw 1 dt {} pt {}", kOthers[other_index % kOthers.size()],
                     2 + other_index % 4, 2 + other_index % 12);
}

double number(const json& v) { return v.is_number() ? v.get<double>() : NAN; }

// scenario → label → points, in the order labels first appear (the report's order).
std::map<std::string, std::vector<std::pair<std::string, Points>>> series(
    const json& sweep, const std::vector<std::string>& labels) {
  std::map<std::string, std::vector<std::pair<std::string, Points>>> out;
  for (const json& row : sweep) {
    const std::string label = row.value("label", "");
    if (!labels.empty() && std::find(labels.begin(), labels.end(), label) == labels.end()) continue;
    auto& by_label = out[row.value("scenario", "")];
    auto it = std::find_if(by_label.begin(), by_label.end(), [&](const auto& p) { return p.first == label; });
    if (it == by_label.end()) it = by_label.insert(by_label.end(), {label, {}});
    it->second.push_back({number(row["sparsity_mean"]), number(row["recall_mean"]),
                          number(row["miss_p99"]), number(row["work_fraction"])});
  }
  return out;
}

std::string data_file(const std::vector<std::pair<std::string, Points>>& by_label) {
  std::string text;
  for (const auto& [label, points] : by_label) {
    text += "# " + label + "\n";
    for (const auto& p : points) text += fmt::format("{} {} {} {}\n", p[0], p[1], p[2], p[3]);
    text += "\n\n";  // gnuplot's index separator
  }
  return text;
}

std::string script(const std::string& scenario, const std::string& dat, const std::string& png,
                   const std::vector<std::pair<std::string, Points>>& by_label) {
  std::string s = fmt::format(
      "set terminal pngcairo size 1200,960 noenhanced\nset output '{}'\nset multiplot layout 2,2 title "
      "'{} — closed loop, all-keep = truth; bottom: against indexer work (fine entries + probe) / full'\n"
      "set key font ',8'\nset grid\nset xlabel 'realised sparsity'\nset ylabel 'mean recall'\n"
      "set yrange [0:1.02]\n",
      png, scenario);
  const auto plot = [&](int x, int column) {
    std::string cmd = "plot ";
    size_t others = 0;
    for (size_t i = 0; i < by_label.size(); ++i) {
      const std::string& label = by_label[i].first;
      const bool compared = std::find(default_plot_predictors().begin(), default_plot_predictors().end(),
                                      label) != default_plot_predictors().end();
      cmd += fmt::format("{}'{}' index {} using {}:{} with linespoints {} title '{}'", i ? ", " : "", dat, i,
                         x, column, style(label, compared ? 0 : others++), label);
    }
    return cmd + "\n";
  };
  s += "set key bottom left\n" + plot(1, 2);
  s += "set ylabel 'p99 miss'\nset key top left\n" + plot(1, 3);
  s += "set xlabel 'indexer work fraction'\nset ylabel 'mean recall'\nset key bottom right\n" + plot(4, 2);
  s += "set ylabel 'p99 miss'\nset key top right\n" + plot(4, 3) + "unset multiplot\n";
  return s;
}

std::string quoted(const std::string& path) {  // for the shell: one argument, whatever it holds
  std::string q = "'";
  for (const char c : path) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A scenario as part of a file name: a trace's scenario is its path, whose slashes would name
// folders that do not exist under the output folder.
std::string file_name_part(const std::string& scenario) {
  std::string out = scenario;
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  return out;
}

}  // namespace

const std::vector<std::string>& default_plot_predictors() {
  static const std::vector<std::string> kCompared = {"spin", "spin-hybrid", "hisa", "step-reuse",
                                                     "prev-iter", "oracle"};
  return kCompared;
}

Result<SweepPlots> draw_sweep_plots(const std::string& out_dir, const std::string& results_json,
                                    const std::vector<std::string>& labels) {
  std::ifstream in(results_json);
  if (!in) return Status(StatusCode::kIoError, fmt::format("plots: cannot read {}", results_json));
  const json results = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (results.is_discarded() || !results.contains("sweep"))
    return Status(StatusCode::kDataLoss, fmt::format("plots: {} holds no sweep", results_json));
  SweepPlots plots;
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    plots.note = "gnuplot not found: plots skipped (install gnuplot-nox, or rerun scripts/install-deps.sh)";
    return plots;
  }
  for (const auto& [scenario, by_label] : series(results["sweep"], labels)) {
    const std::string base = out_dir + "/sweep-" + file_name_part(scenario);
    SPIN_RETURN_IF_ERROR(write_file_atomic(base + ".dat", data_file(by_label)));
    // gnuplot writes a temporary PNG that replaces the old one only when drawn whole.
    const std::string tmp = base + ".png.tmp";
    SPIN_RETURN_IF_ERROR(write_file_atomic(base + ".gp", script(scenario, base + ".dat", tmp, by_label)));
    if (std::system(("gnuplot " + quoted(base + ".gp") + " 2>/dev/null").c_str()) == 0 &&
        std::rename(tmp.c_str(), (base + ".png").c_str()) == 0) {
      plots.pngs.push_back(base + ".png");
    } else {
      std::remove(tmp.c_str());
      plots.note = "gnuplot failed on " + base + ".gp (pngcairo terminal missing?)";
    }
  }
  return plots;
}

}  // namespace spin::cli
