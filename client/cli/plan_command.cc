#include "client/cli/plan_command.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/table.h"
#include "common/dtype.h"
#include "common/shard_metadata.h"
#include "common/sharding_spec_text.h"
#include "common/status_macros.h"
#include "common/tensor_properties.h"
#include "io/file.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kPlanCommand = "plan";

constexpr absl::string_view kFooter = R"(Spec forms (--spec):
  chunk:dim=<int>:<placement>,<placement>,...
      torch.chunk along one dim (negative counts from the end), chunk i to
      placement i.
  enum:<offsets>:<sizes>@<placement>;<offsets>:<sizes>@<placement>;...
      an explicit list of shards (also 'enumerable:'); they must not overlap
      and must cover the tensor.
  A placement is 'rank:<rank>/<device>' or '<worker>/<device>', e.g.
  rank:0/cpu, rank:1/cuda:1.

Spec file (--spec-file), JSON:
  {"type": "chunk", "dim": 0, "placements": ["rank:0/cpu", "rank:1/cpu"]}
  {"type": "enumerable", "shards": [{"offsets": [0, 0], "sizes": [5, 10],
                                     "placement": "rank:0/cpu"}, ...]}
  or the bare array that 'tessera plan --json' prints.

Examples:
  tessera plan --size 10,20 \
      --spec 'chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu'
  tessera plan --size 10,10 --dtype float16 \
      --spec 'enum:0,0:5,10@rank:0/cpu;5,0:5,10@rank:1/cpu'
  tessera plan --size 10,20 --spec-file spec.json --json > shards.json

Exit status: 0 on success, 2 for a usage error or a bad size, spec or dtype,
1 when the spec file cannot be read.)";

int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    return std::numeric_limits<int64_t>::max();
  }
  return sum;
}

int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    return std::numeric_limits<int64_t>::max();
  }
  return product;
}

// A count from the saturating helpers; INT64_MAX means "at least that".
std::string FormatCount(int64_t count) {
  if (count == std::numeric_limits<int64_t>::max()) {
    return absl::StrCat(">=", count);
  }
  return absl::StrCat(count);
}

std::string Plural(int64_t count, absl::string_view noun) {
  return absl::StrCat(FormatCount(count), " ", noun, count == 1 ? "" : "s");
}

// Who holds a shard, for the balance summary: ranks and workers own their
// devices, whatever the device.
std::string OwnerOf(const ShardMetadata& shard) {
  if (!shard.placement().has_value()) return "unplaced";
  const RemoteDevice& device = *shard.placement();
  if (device.rank().has_value()) return absl::StrCat("rank ", *device.rank());
  if (device.worker_name().has_value()) return *device.worker_name();
  return "local";
}

// The spec file's text. Not being able to read it is a failure (exit 1),
// not a usage error, whatever errno says.
absl::StatusOr<std::string> ReadSpecFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  if (contents.ok()) return contents;
  return absl::Status(absl::IsNotFound(contents.status())
                          ? absl::StatusCode::kNotFound
                          : absl::StatusCode::kDataLoss,
                      absl::StrCat("cannot read spec file '", path,
                                   "': ", contents.status().message()));
}

// The title line: what is sharded, and how.
std::string Title(const ShardedTensorMetadata& metadata,
                  const ShardingSpec& spec) {
  std::string how;
  if (const auto* chunk = std::get_if<ChunkShardingSpec>(&spec)) {
    how = absl::StrCat("over chunk dim ", chunk->dim());
    if (chunk->dim() < 0) {
      absl::StrAppend(&how, " (= ",
                      chunk->dim() + static_cast<int64_t>(metadata.size.size()),
                      ")");
    }
  } else {
    how = "from an enumerable spec";
  }
  return absl::StrCat(
      "Sharded tensor ", FormatDims(metadata.size), " ",
      DTypeName(metadata.tensor_properties.dtype), ", ",
      Plural(static_cast<int64_t>(metadata.shards_metadata.size()), "shard"),
      " ", how, "\n");
}

// Totals and balance: how evenly the elements spread over the owners.
std::string Summary(const ShardedTensorMetadata& metadata) {
  const int64_t element_size =
      static_cast<int64_t>(ElementSize(metadata.tensor_properties.dtype));
  std::vector<std::string> owners;  // in order of first appearance
  std::map<std::string, int64_t> elements_by_owner;
  int64_t total = 0;
  int64_t empty_shards = 0;
  bool all_ranks = true;
  for (const ShardMetadata& shard : metadata.shards_metadata) {
    const int64_t numel = shard.numel();
    total = SaturatingAdd(total, numel);
    if (numel == 0) ++empty_shards;
    const std::string owner = OwnerOf(shard);
    all_ranks = all_ranks && shard.placement().has_value() &&
                shard.placement()->rank().has_value();
    auto [it, inserted] = elements_by_owner.emplace(owner, 0);
    if (inserted) owners.push_back(owner);
    it->second = SaturatingAdd(it->second, numel);
  }
  std::string line =
      absl::StrCat("Total: ", Plural(total, "element"), ", ",
                   Plural(SaturatingMul(total, element_size), "byte"), " on ",
                   Plural(static_cast<int64_t>(owners.size()),
                          all_ranks ? "rank" : "owner"));
  if (!owners.empty()) {
    const std::string* min_owner = &owners.front();
    const std::string* max_owner = &owners.front();
    for (const std::string& owner : owners) {
      if (elements_by_owner[owner] < elements_by_owner[*min_owner]) {
        min_owner = &owner;
      }
      if (elements_by_owner[owner] > elements_by_owner[*max_owner]) {
        max_owner = &owner;
      }
    }
    const int64_t max = elements_by_owner[*max_owner];
    absl::StrAppend(&line, "; per ", all_ranks ? "rank" : "owner", ": min ",
                    FormatCount(elements_by_owner[*min_owner]), " (",
                    *min_owner, "), max ", FormatCount(max), " (", *max_owner,
                    ")");
    if (total > 0) {
      const double mean =
          static_cast<double>(total) / static_cast<double>(owners.size());
      absl::StrAppend(&line, absl::StrFormat(", max/mean %.2f",
                                             static_cast<double>(max) / mean));
    }
  }
  if (empty_shards > 0) {
    absl::StrAppend(&line, "; ", Plural(empty_shards, "empty shard"));
  }
  line.push_back('\n');
  return line;
}

}  // namespace

std::string FormatPlanTable(const ShardedTensorMetadata& metadata,
                            const ShardingSpec& spec) {
  const int64_t element_size =
      static_cast<int64_t>(ElementSize(metadata.tensor_properties.dtype));
  std::vector<std::vector<std::string>> rows = {
      {"SHARD", "OFFSETS", "SIZES", "PLACEMENT", "ELEMENTS", "BYTES"}};
  for (size_t i = 0; i < metadata.shards_metadata.size(); ++i) {
    const ShardMetadata& shard = metadata.shards_metadata[i];
    const int64_t numel = shard.numel();
    rows.push_back(
        {absl::StrCat(i), FormatDims(shard.shard_offsets()),
         FormatDims(shard.shard_sizes()),
         shard.placement().has_value() ? shard.placement()->ToString()
                                       : std::string("-"),
         FormatCount(numel), FormatCount(SaturatingMul(numel, element_size))});
  }
  return absl::StrCat(Title(metadata, spec), FormatColumns(rows),
                      Summary(metadata));
}

absl::StatusOr<ShardedTensorMetadata> PlanTensor(
    const ShardingSpec& spec, absl::Span<const int64_t> sizes, DType dtype) {
  TensorProperties properties;
  properties.dtype = dtype;
  return BuildMetadata(spec, sizes, properties);
}

int RunPlan(const PlanOptions& options, const CommandContext& context) {
  if (options.spec.empty() == options.spec_file.empty()) {
    context.PrintError(kPlanCommand,
                       "exactly one of --spec or --spec-file is required; run "
                       "'tessera plan --help' for usage");
    return kExitUsage;
  }
  absl::StatusOr<std::vector<int64_t>> sizes = ParseSizes(options.size);
  if (!sizes.ok()) return context.ReportUserError(kPlanCommand, sizes.status());
  absl::StatusOr<DType> dtype = ParseDType(options.dtype);
  if (!dtype.ok()) return context.ReportUserError(kPlanCommand, dtype.status());

  absl::StatusOr<ShardingSpec> spec;
  if (!options.spec.empty()) {
    spec = ParseShardingSpec(options.spec);
  } else {
    absl::StatusOr<std::string> json = ReadSpecFile(options.spec_file);
    if (!json.ok()) {
      context.PrintError(kPlanCommand, json.status().message());
      return kExitFailure;
    }
    spec = ShardingSpecFromJson(*json);
    if (!spec.ok()) spec = Annotate(spec.status(), options.spec_file);
  }
  if (!spec.ok()) return context.ReportUserError(kPlanCommand, spec.status());

  absl::StatusOr<ShardedTensorMetadata> metadata =
      PlanTensor(*spec, *sizes, *dtype);
  if (!metadata.ok()) {
    return context.ReportUserError(kPlanCommand, metadata.status());
  }

  if (options.json) {
    context.out() << ShardsToJson(metadata->shards_metadata) << "\n";
  } else {
    context.out() << FormatPlanTable(*metadata, *spec);
  }
  context.out().flush();
  return context.out().good() ? kExitOk : kExitFailure;
}

void AddPlanCommand(CLI::App& app, CommandContext& context) {
  CLI::App* plan = app.add_subcommand(
      std::string(kPlanCommand),
      "Show how a sharding spec splits a tensor: each shard's offsets, sizes, "
      "placement and bytes");
  auto options = std::make_shared<PlanOptions>();
  plan->add_option("--size", options->size,
                   "Global tensor size, comma-separated (e.g. 10,20)")
      ->required()
      ->type_name("N,N,...");
  CLI::Option* spec = plan->add_option("--spec", options->spec,
                                       "Sharding spec in text form (see below)")
                          ->type_name("SPEC");
  CLI::Option* spec_file =
      plan->add_option("--spec-file", options->spec_file,
                       "JSON file holding the sharding spec (see below)")
          ->type_name("PATH");
  spec->excludes(spec_file);
  spec_file->excludes(spec);
  plan->add_option("--dtype", options->dtype,
                   "Element type, for the byte counts (float32, bfloat16, "
                   "int64, ...)")
      ->capture_default_str()
      ->type_name("DTYPE");
  plan->add_flag("--json", options->json,
                 "Print the shards as a JSON array instead of a table");
  plan->footer(std::string(kFooter));
  RunWhenParsed(plan, context, kPlanCommand, options, RunPlan);
}

}  // namespace tessera::cli
