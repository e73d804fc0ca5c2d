#include "client/cli/fetch_command.h"

#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/progress_bar.h"
#include "client/cli/table.h"
#include "client/client.h"
#include "client/npy.h"
#include "common/status_macros.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kFetchCommand = "fetch";

}  // namespace

absl::StatusOr<DType> NpyOutputDType(DType dtype, const std::string& cast) {
  DType output = dtype;
  if (!cast.empty()) {
    ASSIGN_OR_RETURN(output, ParseDType(cast));
  }
  if (!NpyDescr(output).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        DTypeName(output),
        " has no numpy dtype, so a .npy file cannot hold it; add --cast "
        "float32 (or another dtype)"));
  }
  return output;
}

absl::Status SaveAsNpy(const Tensor& tensor, DType dtype, OutputFile& file) {
  if (tensor.dtype() == dtype) return WriteNpy(file, tensor);
  ASSIGN_OR_RETURN(Tensor converted, tensor.ToDType(dtype));
  return WriteNpy(file, converted);
}

std::ostream& ReportStream(const OutputFile& file,
                           const CommandContext& context) {
  return file.kind() == OutputFile::Kind::kReplaced ? context.out()
                                                    : context.err();
}

absl::Status CheckCastFlag(const std::string& cast) {
  if (cast.empty()) return absl::OkStatus();
  return ParseDType(cast).status();
}

int RunFetch(const FetchCommandOptions& options,
             const CommandContext& context) {
  // A bad --cast is a usage error even before the tensor is known.
  if (absl::Status cast = CheckCastFlag(options.cast); !cast.ok()) {
    return context.ReportUserError(kFetchCommand, cast);
  }
  absl::StatusOr<ShardedTensorView> view =
      OpenTensor(options.connection, options.name);
  if (!view.ok()) return context.ReportUserError(kFetchCommand, view.status());
  if (options.version > 0) {
    view = view->AtVersion(options.version);
    if (!view.ok())
      return context.ReportUserError(kFetchCommand, view.status());
  }
  absl::StatusOr<DType> dtype = NpyOutputDType(view->dtype(), options.cast);
  if (!dtype.ok()) {
    return context.ReportUserError(
        kFetchCommand,
        Annotate(dtype.status(), absl::StrCat("tensor '", options.name, "'")));
  }

  absl::StatusOr<OutputFile> output = OpenNpyOutput(options.output);
  if (!output.ok())
    return context.ReportUserError(kFetchCommand, output.status());

  Tensor tensor;
  std::string source;
  if (options.shard >= 0) {
    const std::vector<RemoteShard> shards = view->remote_shards();
    if (options.shard >= static_cast<int64_t>(shards.size())) {
      return context.ReportUserError(
          kFetchCommand, absl::OutOfRangeError(absl::StrCat(
                             "--shard ", options.shard, " is out of range: '",
                             options.name, "' has ", shards.size(),
                             " shards (0..", shards.size() - 1, ")")));
    }
    const RemoteShard& remote = shards[static_cast<size_t>(options.shard)];
    FetchOptions fetch;
    fetch.timeout = MakeTransferOptions(options.connection, nullptr).timeout;
    absl::StatusOr<Shard> shard = remote.to_here(fetch);
    if (!shard.ok())
      return context.ReportUserError(kFetchCommand, shard.status());
    tensor = shard->tensor;
    source = absl::StrCat(
        "shard ", options.shard, " of ", options.name, " (offsets ",
        FormatDims(remote.metadata().shard_offsets()), ") from rank ",
        remote.owner().id, " at ", remote.owner().address);
  } else {
    ProgressBar bar(context.err(), absl::StrCat("fetch ", options.name),
                    ProgressWanted(options.connection, context.err()));
    absl::StatusOr<Tensor> read =
        view->Read(MakeTransferOptions(options.connection, &bar));
    bar.Finish();
    if (!read.ok())
      return context.ReportUserError(kFetchCommand, read.status());
    tensor = *std::move(read);
    const size_t count = view->metadata().shards_metadata.size();
    source = absl::StrCat(options.name, " (", count,
                          count == 1 ? " shard)" : " shards)");
  }
  absl::Status saved = SaveAsNpy(tensor, *dtype, *output);
  if (!saved.ok()) {
    context.PrintError(kFetchCommand, saved.message());
    return kExitFailure;
  }
  std::ostream& report = ReportStream(*output, context);
  report << "wrote " << options.output << ": " << source << ", "
         << DescribeArray(*dtype, tensor.sizes()) << "\n";
  report.flush();
  return report.good() ? kExitOk : kExitFailure;
}

void AddFetchCommand(CLI::App& app, CommandContext& context) {
  CLI::App* fetch = app.add_subcommand(
      std::string(kFetchCommand),
      "Fetch a whole tensor, or one shard, into a .npy file");
  auto options = std::make_shared<FetchCommandOptions>();
  fetch->add_option("name", options->name, "The tensor's name")
      ->required()
      ->type_name("NAME");
  fetch
      ->add_option("-o,--output", options->output,
                   "The .npy file to write (replaced atomically; - for stdout)")
      ->required()
      ->type_name("FILE");
  fetch
      ->add_option("--shard", options->shard,
                   "Fetch only shard I (as numbered by 'tessera describe')")
      ->check(Whole(0, std::numeric_limits<int64_t>::max()))
      ->type_name("I");
  fetch
      ->add_option("--cast", options->cast,
                   "Convert to this dtype before writing (bfloat16 tensors "
                   "need one: .npy has no bfloat16)")
      ->type_name("DTYPE");
  fetch
      ->add_option("--version", options->version,
                   "A versioned tensor's published version to read (default: "
                   "the latest)")
      ->check(Whole(1, std::numeric_limits<int64_t>::max()))
      ->type_name("N");
  AddConnectionFlags(app, fetch, &options->connection, /*transfers=*/true);
  fetch->footer(
      "Examples:\n"
      "  tessera fetch w -o w.npy          # then numpy.load('w.npy')\n"
      "  tessera fetch w --shard 2 -o w2.npy\n"
      "  tessera fetch h -o h.npy --cast float32\n\n"
      "Exit status: 0 on success, 1 when the tensor does not exist, a daemon "
      "cannot be reached or the file cannot be written, 2 for a usage "
      "error.");
  RunWhenParsed(fetch, context, kFetchCommand, options, RunFetch);
}

}  // namespace tessera::cli
