#include "client/cli/read_command.h"

#include <algorithm>
#include <complex>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cli/fetch_command.h"
#include "client/cli/progress_bar.h"
#include "client/cli/table.h"
#include "client/client.h"
#include "client/npy.h"
#include "common/sharding_spec_text.h"
#include "common/status_macros.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kReadCommand = "read";

template <typename T>
std::string FormatElement(T value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value ? "True" : "False";
  } else if constexpr (std::is_integral_v<T>) {
    return absl::StrCat(static_cast<int64_t>(value));
  } else if constexpr (std::is_same_v<T, std::complex<float>> ||
                       std::is_same_v<T, std::complex<double>>) {
    const double imag = static_cast<double>(value.imag());
    return absl::StrCat(static_cast<double>(value.real()),
                        std::signbit(imag) ? "-" : "+", std::abs(imag), "j");
  } else {
    return absl::StrCat(ToDouble(value));
  }
}

// Nested brackets over `cells` (row-major), numpy's layout: rows of the
// last dimension on one line, a blank line more per outer dimension.
void AppendNested(const std::vector<std::string>& cells,
                  const std::vector<int64_t>& sizes, size_t dim, int64_t* next,
                  std::string* text) {
  if (dim == sizes.size()) {
    absl::StrAppend(text, cells[static_cast<size_t>((*next)++)]);
    return;
  }
  text->push_back('[');
  const std::string separator =
      dim + 1 == sizes.size()
          ? std::string(", ")
          : absl::StrCat(",", std::string(sizes.size() - dim - 1, '\n'),
                         std::string(dim + 1, ' '));
  for (int64_t i = 0; i < sizes[dim]; ++i) {
    if (i > 0) absl::StrAppend(text, separator);
    AppendNested(cells, sizes, dim + 1, next, text);
  }
  text->push_back(']');
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ParseIndexList(absl::string_view text,
                                                    absl::string_view flag) {
  if (text.empty()) return std::vector<int64_t>{};  // a 0-d tensor
  absl::StatusOr<std::vector<int64_t>> values = ParseSizes(text);
  if (!values.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid ", flag, " '", text,
        "': expected non-negative integers separated by commas (e.g. 2,5)"));
  }
  return values;
}

std::string FormatTensorValues(const Tensor& tensor) {
  absl::StatusOr<Tensor> host =
      tensor.device().is_cpu() ? tensor.Contiguous() : tensor.To(Device::Cpu());
  if (!host.ok()) return absl::StrCat("<", host.status().message(), ">\n");
  std::vector<std::string> cells(static_cast<size_t>(host->numel()));
  DispatchDType(host->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* data = host->data<T>();
    for (size_t i = 0; i < cells.size(); ++i) cells[i] = FormatElement(data[i]);
  });
  size_t width = 0;
  for (const std::string& cell : cells) width = std::max(width, cell.size());
  for (std::string& cell : cells) cell.insert(0, width - cell.size(), ' ');
  std::string text;
  int64_t next = 0;
  AppendNested(cells, host->sizes(), 0, &next, &text);
  text.push_back('\n');
  return text;
}

int RunRead(const ReadCommandOptions& options, const CommandContext& context) {
  absl::StatusOr<std::vector<int64_t>> offsets =
      ParseIndexList(options.offsets, "--offsets");
  if (!offsets.ok())
    return context.ReportUserError(kReadCommand, offsets.status());
  absl::StatusOr<std::vector<int64_t>> sizes =
      ParseIndexList(options.sizes, "--sizes");
  if (!sizes.ok()) return context.ReportUserError(kReadCommand, sizes.status());
  if (offsets->size() != sizes->size()) {
    return context.ReportUserError(
        kReadCommand,
        absl::InvalidArgumentError(absl::StrCat(
            "--offsets has ", offsets->size(), " entries but --sizes has ",
            sizes->size(), "; give one of each per dimension")));
  }
  const std::optional<int64_t> numel = CheckedProduct(*sizes);
  if (options.output.empty() &&
      (!numel.has_value() || *numel > kMaxPrintedElements)) {
    return context.ReportUserError(
        kReadCommand, absl::InvalidArgumentError(absl::StrCat(
                          "the box holds ",
                          numel.has_value() ? absl::StrCat(*numel) : "too many",
                          " elements, more than the ", kMaxPrintedElements,
                          " printed; write them to a file with -o FILE.npy")));
  }
  // A bad --cast is a usage error even before the tensor is known.
  if (absl::Status cast = CheckCastFlag(options.cast); !cast.ok()) {
    return context.ReportUserError(kReadCommand, cast);
  }

  absl::StatusOr<ShardedTensorView> view =
      OpenTensor(options.connection, options.name);
  if (!view.ok()) return context.ReportUserError(kReadCommand, view.status());
  if (options.version > 0) {
    view = view->AtVersion(options.version);
    if (!view.ok()) return context.ReportUserError(kReadCommand, view.status());
  }
  DType dtype = view->dtype();
  if (!options.output.empty()) {
    absl::StatusOr<DType> npy_dtype =
        NpyOutputDType(view->dtype(), options.cast);
    if (!npy_dtype.ok()) {
      return context.ReportUserError(
          kReadCommand, Annotate(npy_dtype.status(),
                                 absl::StrCat("tensor '", options.name, "'")));
    }
    dtype = *npy_dtype;
  } else if (!options.cast.empty()) {
    dtype = ParseDType(options.cast).value();
  }

  std::optional<OutputFile> output;
  if (!options.output.empty()) {
    absl::StatusOr<OutputFile> opened = OpenNpyOutput(options.output);
    if (!opened.ok())
      return context.ReportUserError(kReadCommand, opened.status());
    output.emplace(*std::move(opened));
  }

  ProgressBar bar(context.err(), absl::StrCat("read ", options.name),
                  ProgressWanted(options.connection, context.err()));
  absl::StatusOr<Tensor> box = view->ReadRegion(
      *offsets, *sizes, MakeTransferOptions(options.connection, &bar));
  bar.Finish();
  if (!box.ok()) return context.ReportUserError(kReadCommand, box.status());

  if (options.output.empty()) {
    absl::StatusOr<Tensor> values =
        box->dtype() == dtype ? *box : box->ToDType(dtype);
    if (!values.ok())
      return context.ReportUserError(kReadCommand, values.status());
    context.out() << FormatTensorValues(*values);
  } else {
    absl::Status saved = SaveAsNpy(*box, dtype, *output);
    if (!saved.ok()) {
      context.PrintError(kReadCommand, saved.message());
      return kExitFailure;
    }
    std::ostream& report = ReportStream(*output, context);
    report << "wrote " << options.output << ": " << options.name << " at "
           << FormatDims(*offsets) << ", " << DescribeArray(dtype, box->sizes())
           << "\n";
    report.flush();
    if (!report.good()) return kExitFailure;
  }
  context.out().flush();
  return context.out().good() ? kExitOk : kExitFailure;
}

void AddReadCommand(CLI::App& app, CommandContext& context) {
  CLI::App* read = app.add_subcommand(
      std::string(kReadCommand),
      "Read a box of a tensor (from every shard that overlaps it): print it "
      "or write a .npy file");
  auto options = std::make_shared<ReadCommandOptions>();
  read->add_option("name", options->name, "The tensor's name")
      ->required()
      ->type_name("NAME");
  read->add_option("--offsets", options->offsets,
                   "Where the box starts, one index per dimension")
      ->required()
      ->type_name("N,N,...");
  read->add_option("--sizes", options->sizes,
                   "The box's extent, one size per dimension")
      ->required()
      ->type_name("N,N,...");
  read->add_option("-o,--output", options->output,
                   absl::StrCat("Write a .npy file instead of printing (needed "
                                "for more than ",
                                kMaxPrintedElements, " elements)"))
      ->type_name("FILE");
  read->add_option("--cast", options->cast,
                   "Convert to this dtype first (bfloat16 needs one for -o)")
      ->type_name("DTYPE");
  read->add_option("--version", options->version,
                   "A versioned tensor's published version to read (default: "
                   "the latest)")
      ->check(Whole(1, std::numeric_limits<int64_t>::max()))
      ->type_name("N");
  AddConnectionFlags(app, read, &options->connection, /*transfers=*/true);
  read->footer(
      "Examples:\n"
      "  tessera read w --offsets 2,5 --sizes 6,10\n"
      "  tessera read w --offsets 0,0 --sizes 1000,4096 -o box.npy\n\n"
      "Exit status: 0 on success, 1 when the tensor does not exist, a daemon "
      "cannot be reached or the file cannot be written, 2 for a usage error "
      "or a box outside the tensor.");
  RunWhenParsed(read, context, kReadCommand, options, RunRead);
}

}  // namespace tessera::cli
