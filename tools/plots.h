// `spin eval`'s plots, drawn by the tool from the results.json the library wrote: the library
// computes and writes files, it runs no programs. One PNG per scenario (mean recall and p99 miss
// against realised sparsity and against indexer work), the predictors a reader compares in
// distinct styles, the rest on request.
#pragma once

#include <string>
#include <vector>

#include "spin/status.h"

namespace spin::cli {

// spin, spin-hybrid, hisa, step-reuse, prev-iter, oracle: SPIN, its extension, its peers, the bound.
const std::vector<std::string>& default_plot_predictors();

struct SweepPlots {
  std::vector<std::string> pngs;  // written (none when gnuplot is missing: `note` says so)
  std::string note;
};

// Reads `results_json`'s sweep, writes sweep-<scenario>.dat/.gp into out_dir (atomically) and runs
// gnuplot on each. `labels`: the sweep labels to draw (empty: every one). Fails only on I/O or a
// results file that does not parse; a missing or failing gnuplot is a note, not an error.
Result<SweepPlots> draw_sweep_plots(const std::string& out_dir, const std::string& results_json,
                                    const std::vector<std::string>& labels);

}  // namespace spin::cli
