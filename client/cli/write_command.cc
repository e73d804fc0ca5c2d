#include "client/cli/write_command.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/progress_bar.h"
#include "client/cli/read_command.h"
#include "client/cli/table.h"
#include "client/client.h"
#include "client/npy.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kWriteCommand = "write";

}  // namespace

int RunWrite(const WriteCommandOptions& options,
             const CommandContext& context) {
  std::vector<int64_t> offsets;
  if (options.offsets_given) {
    absl::StatusOr<std::vector<int64_t>> parsed =
        ParseIndexList(options.offsets, "--offsets");
    if (!parsed.ok())
      return context.ReportUserError(kWriteCommand, parsed.status());
    offsets = *std::move(parsed);
  }
  // The file first: a typo in its name should not wait for a daemon.
  absl::StatusOr<Tensor> data = ReadNpy(options.input);
  if (!data.ok()) return context.ReportUserError(kWriteCommand, data.status());
  if (!options.offsets_given) offsets.assign(data->sizes().size(), 0);
  if (offsets.size() != data->sizes().size()) {
    return context.ReportUserError(
        kWriteCommand, absl::InvalidArgumentError(absl::StrCat(
                           "--offsets has ", offsets.size(), " entries but ",
                           options.input, " holds a ", data->sizes().size(),
                           "-d array ", FormatDims(data->sizes()))));
  }

  absl::StatusOr<ShardedTensorView> view =
      OpenTensor(options.connection, options.name);
  if (!view.ok()) return context.ReportUserError(kWriteCommand, view.status());
  if (view->sizes().size() != data->sizes().size()) {
    return context.ReportUserError(
        kWriteCommand,
        absl::InvalidArgumentError(absl::StrCat(
            options.input, " holds a ", data->sizes().size(), "-d array ",
            FormatDims(data->sizes()), " but '", options.name, "' is ",
            view->sizes().size(), "-d ", FormatDims(view->sizes()))));
  }
  if (data->dtype() != view->dtype()) {
    if (!options.cast) {
      return context.ReportUserError(
          kWriteCommand,
          absl::InvalidArgumentError(absl::StrCat(
              options.input, " holds ", DTypeName(data->dtype()), " but '",
              options.name, "' is ", DTypeName(view->dtype()),
              "; add --cast to convert")));
    }
    absl::StatusOr<Tensor> converted = data->ToDType(view->dtype());
    if (!converted.ok()) {
      return context.ReportUserError(kWriteCommand, converted.status());
    }
    data = *std::move(converted);
  }

  ProgressBar bar(context.err(), absl::StrCat("write ", options.name),
                  ProgressWanted(options.connection, context.err()));
  absl::Status written = view->Write(
      offsets, *data, MakeTransferOptions(options.connection, &bar));
  bar.Finish();
  if (!written.ok()) return context.ReportUserError(kWriteCommand, written);
  context.out() << "wrote " << options.input << " into " << options.name
                << " at " << FormatDims(offsets) << ": "
                << DescribeArray(data->dtype(), data->sizes()) << "\n";
  context.out().flush();
  return context.out().good() ? kExitOk : kExitFailure;
}

void AddWriteCommand(CLI::App& app, CommandContext& context) {
  CLI::App* write = app.add_subcommand(
      std::string(kWriteCommand),
      "Write a .npy array into a tensor at the given offsets");
  auto options = std::make_shared<WriteCommandOptions>();
  write->add_option("name", options->name, "The tensor's name")
      ->required()
      ->type_name("NAME");
  write
      ->add_option("-i,--input", options->input,
                   "The .npy file to write (numpy.save's format; - for stdin)")
      ->required()
      ->type_name("FILE");
  CLI::Option* offsets =
      write
          ->add_option("--offsets", options->offsets,
                       "Where the array goes, one index per dimension "
                       "(default: all zeros)")
          ->type_name("N,N,...");
  write->add_flag("--cast", options->cast,
                  "Convert the array to the tensor's dtype when they differ");
  AddConnectionFlags(app, write, &options->connection, /*transfers=*/true);
  write->footer(
      "Examples:\n"
      "  tessera write w --offsets 0,0 -i patch.npy\n"
      "  tessera write w --offsets 4,0 -i rows.npy --cast\n\n"
      "Exit status: 0 on success, 1 when the file cannot be read, the tensor "
      "does not exist or a daemon cannot be reached, 2 for a usage error, a "
      "malformed file, a dtype or shape mismatch or a box outside the "
      "tensor.");
  RunWhenParsed(write, context, kWriteCommand, options, RunWrite,
                [offsets](WriteCommandOptions& parsed) {
                  parsed.offsets_given = offsets->count() > 0;
                });
}

}  // namespace tessera::cli
