#include "client/cli/create_command.h"

#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/describe_command.h"
#include "client/cli/plan_command.h"
#include "common/sharding_spec.h"
#include "common/sharding_spec_text.h"
#include "common/tensor_properties.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kCreateCommand = "create";

struct InitName {
  absl::string_view name;
  TensorInit init;
};
constexpr InitName kInits[] = {
    {"empty", TensorInit::kEmpty}, {"zeros", TensorInit::kZeros},
    {"ones", TensorInit::kOnes},   {"full", TensorInit::kFull},
    {"rand", TensorInit::kRand},   {"randn", TensorInit::kRandn},
};

}  // namespace

absl::StatusOr<TensorInit> ParseTensorInit(absl::string_view text) {
  for (const InitName& entry : kInits) {
    if (entry.name == text) return entry.init;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --init '", text,
                   "': expected empty, zeros, ones, full, rand or randn"));
}

int RunCreate(const CreateCommandOptions& options,
              const CommandContext& context) {
  // Everything the user typed is checked before a daemon is contacted.
  absl::StatusOr<std::vector<int64_t>> sizes = ParseSizes(options.size);
  if (!sizes.ok())
    return context.ReportUserError(kCreateCommand, sizes.status());
  absl::StatusOr<DType> dtype = ParseDType(options.dtype);
  if (!dtype.ok())
    return context.ReportUserError(kCreateCommand, dtype.status());
  absl::StatusOr<ShardingSpec> spec = ParseShardingSpec(options.spec);
  if (!spec.ok()) return context.ReportUserError(kCreateCommand, spec.status());
  absl::StatusOr<ShardedTensorMetadata> metadata =
      PlanTensor(*spec, *sizes, *dtype);
  if (!metadata.ok()) {
    return context.ReportUserError(kCreateCommand, metadata.status());
  }
  CreateOptions create;
  create.dtype = *dtype;
  create.seed = options.seed;
  create.copies = options.copies;
  create.versions = options.versions;
  create.fill_value = options.fill;
  if (options.init.empty()) {
    create.init = options.fill_given ? TensorInit::kFull : TensorInit::kEmpty;
  } else {
    absl::StatusOr<TensorInit> init = ParseTensorInit(options.init);
    if (!init.ok())
      return context.ReportUserError(kCreateCommand, init.status());
    create.init = *init;
  }
  if (options.fill_given && create.init != TensorInit::kFull) {
    return context.ReportUserError(
        kCreateCommand,
        absl::InvalidArgumentError(absl::StrCat(
            "--fill needs --init full, not --init ", options.init)));
  }
  if ((create.init == TensorInit::kRand || create.init == TensorInit::kRandn) &&
      !IsFloatingPoint(*dtype) && !IsComplex(*dtype)) {
    return context.ReportUserError(
        kCreateCommand,
        absl::InvalidArgumentError(absl::StrCat(
            "--init ", options.init, " needs a floating or complex dtype, not ",
            DTypeName(*dtype))));
  }

  absl::StatusOr<std::shared_ptr<Client>> client =
      ConnectToCluster(options.connection);
  if (!client.ok())
    return context.ReportUserError(kCreateCommand, client.status());
  absl::StatusOr<ShardedTensorView> view =
      (*client)->Create(options.name, *sizes, *spec, create);
  if (!view.ok()) return context.ReportUserError(kCreateCommand, view.status());
  return PrintShardTable(*view, (*client)->cluster(), options.json, context);
}

void AddCreateCommand(CLI::App& app, CommandContext& context) {
  CLI::App* create = app.add_subcommand(
      std::string(kCreateCommand),
      "Create a named sharded tensor (empty, zeros, ones, full, rand, randn)");
  auto options = std::make_shared<CreateCommandOptions>();
  create
      ->add_option("name", options->name,
                   "Name of the new tensor ([A-Za-z0-9_.-], unique)")
      ->required()
      ->type_name("NAME");
  create
      ->add_option("--size", options->size,
                   "Global tensor size, comma-separated (e.g. 10,20)")
      ->required()
      ->type_name("N,N,...");
  create
      ->add_option("--spec", options->spec,
                   "Sharding spec in text form, as for 'tessera plan'")
      ->required()
      ->type_name("SPEC");
  create
      ->add_option("--dtype", options->dtype,
                   "Element type (float32, float64, float16, bfloat16, "
                   "int64, bool, ...)")
      ->capture_default_str()
      ->type_name("DTYPE");
  create
      ->add_option("--init", options->init,
                   "How to fill it: empty (default: no values promised; "
                   "reads as zeros), zeros, ones, full, rand (uniform [0, "
                   "1)), randn (standard normal)")
      ->type_name("KIND");
  CLI::Option* fill =
      create
          ->add_option("--fill", options->fill,
                       "The value of every element (--init full)")
          ->type_name("VALUE");
  create
      ->add_option("--seed", options->seed,
                   "Seed of rand and randn: same seed, same values")
      ->check(Whole(0, std::numeric_limits<uint64_t>::max()))
      ->capture_default_str()
      ->type_name("N");
  create
      ->add_option("--copies,--replicas", options->copies,
                   "Copies of every shard, the owner's included: 1 "
                   "(default), the owner's only; C > 1, C - 1 other daemons "
                   "(other hosts first) hold a replica, every write reaches "
                   "them, reads fall back to them when the owner is dead or "
                   "stalled, and a restarted owner refills from them "
                   "(--replicas: the same, an older name)")
      ->check(Whole(1, 1 << 20))
      ->capture_default_str()
      ->type_name("C");
  create
      ->add_option("--versions", options->versions,
                   "Published versions kept (docs/versions.md): 1 (default), "
                   "written in place; K from 2 to 64, a versioned tensor, "
                   "written by versions that are published atomically and "
                   "read one published version at a time")
      ->check(Whole(1, 64))
      ->type_name("K");
  AddConnectionFlags(app, create, &options->connection, /*transfers=*/false);
  create->add_flag("--json", options->json,
                   "Print the shard table as JSON (as 'tessera describe "
                   "--json')");
  create->footer(
      "Examples:\n"
      "  tessera create w --size 10,20 --init ones \\\n"
      "      --spec 'chunk:dim=0:rank:0/cpu,rank:1/cpu,rank:2/cpu,rank:3/cpu'\n"
      "  tessera create e --size 8,8 --dtype float64 --init randn --seed 7 \\\n"
      "      --spec 'enum:0,0:4,8@rank:0/cpu;4,0:4,8@rank:1/cpu'\n"
      "  tessera create c --size 4 --fill 2.5 --spec 'chunk:dim=0:rank:0/cpu'\n"
      "  tessera create r --size 8,8 --init randn --copies 2 \\\n"
      "      --spec 'chunk:dim=0:rank:0/cpu,rank:1/cpu'"
      "\n\n"
      "Placements name the cluster's ranks and their devices (rank:0/cpu,\n"
      "rank:1/cuda:1); 'tessera plan --help' explains the spec forms.\n\n"
      "Exit status: 0 on success, 1 when the name is taken or the cluster "
      "cannot be reached, 2 for a usage error or a bad size, spec, dtype or "
      "init.");
  RunWhenParsed(create, context, kCreateCommand, options, RunCreate,
                [fill](CreateCommandOptions& parsed) {
                  parsed.fill_given = fill->count() > 0;
                });
}

}  // namespace tessera::cli
