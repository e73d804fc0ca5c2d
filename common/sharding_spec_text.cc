#include "common/sharding_spec_text.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace tessera {
namespace {

constexpr absl::string_view kChunkGrammar =
    "chunk:dim=<int>:<placement>,<placement>,... "
    "(e.g. chunk:dim=0:rank:0/cpu,rank:1/cpu)";
constexpr absl::string_view kShardGrammar =
    "<offsets>:<sizes>@<placement> (e.g. 0,0:5,5@rank:0/cpu)";
constexpr absl::string_view kEnumGrammar =
    "enum:<offsets>:<sizes>@<placement>;<offsets>:<sizes>@<placement>;... "
    "(e.g. enum:0,0:5,5@rank:0/cpu;5,0:5,5@rank:1/cpu)";

// The same status with `prefix` put before its message.
absl::Status WithPrefix(const absl::Status& status, absl::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

bool IsAllDigits(absl::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// A decimal integer: an optional '-' and digits, no '+', no spaces.
std::optional<int64_t> ParseInt(absl::string_view text) {
  absl::string_view digits = text;
  absl::ConsumePrefix(&digits, "-");
  int64_t value = 0;
  if (!IsAllDigits(digits) || !absl::SimpleAtoi(text, &value)) {
    return std::nullopt;
  }
  return value;
}

// A C-like identifier: what a named dimension ("H", "batch") looks like.
bool IsIdentifier(absl::string_view text) {
  if (text.empty()) return false;
  if (!absl::ascii_isalpha(static_cast<unsigned char>(text[0])) &&
      text[0] != '_') {
    return false;
  }
  for (char c : text) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') {
      return false;
    }
  }
  return true;
}

// Comma-separated non-negative integers. An empty (all-blank) text is the
// empty list only when `allow_empty`. On error, the message reads
// "Invalid <what> '<text>': <plural> must be non-negative ...".
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text,
                                                  absl::string_view what,
                                                  absl::string_view plural,
                                                  bool allow_empty) {
  std::vector<int64_t> values;
  const absl::string_view stripped = absl::StripAsciiWhitespace(text);
  if (stripped.empty()) {
    if (allow_empty) return values;
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid ", what, " '", text, "': ", plural,
                     " must be non-negative integers separated by commas; "
                     "got nothing"));
  }
  const std::vector<absl::string_view> entries = absl::StrSplit(stripped, ',');
  for (size_t i = 0; i < entries.size(); ++i) {
    const absl::string_view entry = absl::StripAsciiWhitespace(entries[i]);
    int64_t value = 0;
    if (!IsAllDigits(entry) || !absl::SimpleAtoi(entry, &value)) {
      const std::string problem =
          entry.empty()        ? absl::StrCat("entry ", i + 1, " is empty")
          : IsAllDigits(entry) ? absl::StrCat("'", entry, "' is too large")
                               : absl::StrCat("bad entry '", entry, "'");
      return absl::InvalidArgumentError(absl::StrCat(
          "Invalid ", what, " '", text, "': ", plural,
          " must be non-negative integers separated by commas; ", problem));
    }
    values.push_back(value);
  }
  return values;
}

// Splits a comma-separated placement list, rejecting empty entries (a
// trailing comma is a typo, not "no placement").
absl::StatusOr<std::vector<std::string>> SplitPlacements(
    absl::string_view text, absl::string_view spec_text) {
  std::vector<std::string> placements;
  const std::vector<absl::string_view> entries = absl::StrSplit(text, ',');
  for (size_t i = 0; i < entries.size(); ++i) {
    const absl::string_view entry = absl::StripAsciiWhitespace(entries[i]);
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Invalid chunk sharding spec '", spec_text, "': placement ", i + 1,
          " is empty; expected ", kChunkGrammar));
    }
    placements.emplace_back(entry);
  }
  return placements;
}

// `body` is what follows "chunk:".
absl::StatusOr<ShardingSpec> ParseChunk(absl::string_view body,
                                        absl::string_view spec_text) {
  auto grammar_error = [&](absl::string_view problem) {
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid chunk sharding spec '", spec_text, "': ", problem,
                     "; expected ", kChunkGrammar));
  };
  const size_t colon = body.find(':');
  if (colon == absl::string_view::npos) {
    return grammar_error("missing ':' before the placements");
  }
  absl::string_view dim_part =
      absl::StripAsciiWhitespace(body.substr(0, colon));
  const absl::string_view placements_part = body.substr(colon + 1);
  if (!absl::ConsumePrefix(&dim_part, "dim")) {
    return grammar_error(absl::StrCat(
        "expected 'dim=<int>' after 'chunk:', got '", dim_part, "'"));
  }
  dim_part = absl::StripLeadingAsciiWhitespace(dim_part);
  if (!absl::ConsumePrefix(&dim_part, "=")) {
    return grammar_error("expected '=' after 'dim'");
  }
  const absl::string_view dim_text = absl::StripAsciiWhitespace(dim_part);
  if (absl::StripAsciiWhitespace(placements_part).empty()) {
    return grammar_error("no placements");
  }
  ASSIGN_OR_RETURN(std::vector<std::string> placements,
                   SplitPlacements(placements_part, spec_text));
  if (const std::optional<int64_t> dim = ParseInt(dim_text)) {
    ASSIGN_OR_RETURN(ChunkShardingSpec spec,
                     ChunkShardingSpec::Create(*dim, placements));
    return ShardingSpec(std::move(spec));
  }
  if (IsIdentifier(dim_text)) {
    ASSIGN_OR_RETURN(ChunkShardingSpec spec,
                     ChunkShardingSpec::CreateNamed(dim_text, placements));
    return ShardingSpec(std::move(spec));
  }
  if (IsAllDigits(absl::StripPrefix(dim_text, "-"))) {
    return grammar_error(absl::StrCat("dim '", dim_text, "' is out of range"));
  }
  return grammar_error(
      absl::StrCat("dim '", dim_text, "' is not an integer or a name"));
}

absl::StatusOr<ShardMetadata> ParseShard(absl::string_view shard_text) {
  const std::string context =
      absl::StrCat("Invalid shard '", shard_text, "' in enumerable spec: ");
  absl::string_view box = shard_text;
  std::optional<absl::string_view> placement;
  if (const size_t at = shard_text.find('@'); at != absl::string_view::npos) {
    box = shard_text.substr(0, at);
    placement = absl::StripAsciiWhitespace(shard_text.substr(at + 1));
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(box, ':');
  if (parts.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, "expected ", kShardGrammar));
  }
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  {
    auto parsed =
        ParseIntList(parts[0], "offsets", "offsets", /*allow_empty=*/true);
    if (!parsed.ok()) return WithPrefix(parsed.status(), context);
    offsets = *std::move(parsed);
  }
  {
    auto parsed =
        ParseIntList(parts[1], "sizes", "sizes", /*allow_empty=*/true);
    if (!parsed.ok()) return WithPrefix(parsed.status(), context);
    sizes = *std::move(parsed);
  }
  absl::StatusOr<ShardMetadata> shard =
      placement.has_value()
          ? ShardMetadata::Create(std::move(offsets), std::move(sizes),
                                  *placement)
          : ShardMetadata::Create(std::move(offsets), std::move(sizes));
  if (!shard.ok()) return WithPrefix(shard.status(), context);
  return shard;
}

// `body` is what follows "enum:".
absl::StatusOr<ShardingSpec> ParseEnumerable(absl::string_view body,
                                             absl::string_view spec_text) {
  std::vector<ShardMetadata> shards;
  const std::vector<absl::string_view> entries = absl::StrSplit(body, ';');
  for (size_t i = 0; i < entries.size(); ++i) {
    const absl::string_view entry = absl::StripAsciiWhitespace(entries[i]);
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Invalid enumerable sharding spec '", spec_text, "': shard ", i + 1,
          " is empty; expected ", kEnumGrammar));
    }
    ASSIGN_OR_RETURN(ShardMetadata shard, ParseShard(entry));
    shards.push_back(std::move(shard));
  }
  ASSIGN_OR_RETURN(EnumerableShardingSpec spec,
                   EnumerableShardingSpec::Create(std::move(shards)));
  return ShardingSpec(std::move(spec));
}

// ---------------------------------------------------------------- JSON in.

using Json = nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(
      "Invalid JSON sharding spec: field \"", field, "\" ", problem));
}

// Rejects keys of `object` outside `allowed`, naming the first one.
absl::Status CheckKeys(const Json& object, absl::string_view where,
                       std::initializer_list<absl::string_view> allowed) {
  for (const auto& item : object.items()) {
    bool known = false;
    for (absl::string_view key : allowed) known = known || item.key() == key;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Invalid JSON sharding spec: unknown field \"", item.key(), "\" in ",
          where, " (expected ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> JsonInt(const Json& value, absl::string_view field) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FieldError(field, "is too large");
    }
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return FieldError(
      field, absl::StrCat("must be an integer, got ", value.type_name()));
}

absl::StatusOr<std::vector<int64_t>> JsonIntArray(const Json& value,
                                                  absl::string_view field) {
  if (!value.is_array()) {
    return FieldError(field, absl::StrCat("must be an array of integers, got ",
                                          value.type_name()));
  }
  std::vector<int64_t> values;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string element = absl::StrCat(field, "[", i, "]");
    ASSIGN_OR_RETURN(int64_t v, JsonInt(value[i], element));
    if (v < 0) return FieldError(element, "must be non-negative");
    values.push_back(v);
  }
  return values;
}

const Json* FindField(const Json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

absl::StatusOr<ShardingSpec> ChunkFromJson(const Json& root) {
  RETURN_IF_ERROR(CheckKeys(root, "chunk spec", {"type", "dim", "placements"}));
  const Json* dim = FindField(root, "dim");
  if (dim == nullptr) return FieldError("dim", "is missing");
  const Json* placements_json = FindField(root, "placements");
  if (placements_json == nullptr) return FieldError("placements", "is missing");
  if (!placements_json->is_array()) {
    return FieldError("placements",
                      absl::StrCat("must be an array of strings, got ",
                                   placements_json->type_name()));
  }
  std::vector<std::string> placements;
  for (size_t i = 0; i < placements_json->size(); ++i) {
    const Json& placement = (*placements_json)[i];
    if (!placement.is_string()) {
      return FieldError(
          absl::StrCat("placements[", i, "]"),
          absl::StrCat("must be a string, got ", placement.type_name()));
    }
    placements.push_back(placement.get<std::string>());
  }
  if (dim->is_string()) {
    ASSIGN_OR_RETURN(
        ChunkShardingSpec spec,
        ChunkShardingSpec::CreateNamed(dim->get<std::string>(), placements));
    return ShardingSpec(std::move(spec));
  }
  if (!dim->is_number_integer()) {
    return FieldError(
        "dim",
        absl::StrCat("must be an integer or a string, got ", dim->type_name()));
  }
  ASSIGN_OR_RETURN(int64_t dim_value, JsonInt(*dim, "dim"));
  ASSIGN_OR_RETURN(ChunkShardingSpec spec,
                   ChunkShardingSpec::Create(dim_value, placements));
  return ShardingSpec(std::move(spec));
}

absl::StatusOr<ShardMetadata> ShardFromJson(const Json& shard,
                                            absl::string_view where) {
  if (!shard.is_object()) {
    return FieldError(
        where, absl::StrCat("must be an object, got ", shard.type_name()));
  }
  RETURN_IF_ERROR(CheckKeys(shard, where, {"offsets", "sizes", "placement"}));
  const Json* offsets_json = FindField(shard, "offsets");
  if (offsets_json == nullptr) {
    return FieldError(absl::StrCat(where, ".offsets"), "is missing");
  }
  const Json* sizes_json = FindField(shard, "sizes");
  if (sizes_json == nullptr) {
    return FieldError(absl::StrCat(where, ".sizes"), "is missing");
  }
  ASSIGN_OR_RETURN(
      std::vector<int64_t> offsets,
      JsonIntArray(*offsets_json, absl::StrCat(where, ".offsets")));
  ASSIGN_OR_RETURN(std::vector<int64_t> sizes,
                   JsonIntArray(*sizes_json, absl::StrCat(where, ".sizes")));
  const Json* placement = FindField(shard, "placement");
  absl::StatusOr<ShardMetadata> result;
  if (placement == nullptr || placement->is_null()) {
    result = ShardMetadata::Create(std::move(offsets), std::move(sizes));
  } else if (placement->is_string()) {
    result = ShardMetadata::Create(std::move(offsets), std::move(sizes),
                                   placement->get<std::string>());
  } else {
    return FieldError(
        absl::StrCat(where, ".placement"),
        absl::StrCat("must be a string or null, got ", placement->type_name()));
  }
  if (!result.ok()) {
    return WithPrefix(
        result.status(),
        absl::StrCat("Invalid JSON sharding spec: ", where, ": "));
  }
  return result;
}

absl::StatusOr<ShardingSpec> ShardsFromJson(const Json& shards_json,
                                            absl::string_view field) {
  if (!shards_json.is_array()) {
    return FieldError(field, absl::StrCat("must be an array of shards, got ",
                                          shards_json.type_name()));
  }
  std::vector<ShardMetadata> shards;
  for (size_t i = 0; i < shards_json.size(); ++i) {
    ASSIGN_OR_RETURN(
        ShardMetadata shard,
        ShardFromJson(shards_json[i], absl::StrCat(field, "[", i, "]")));
    shards.push_back(std::move(shard));
  }
  ASSIGN_OR_RETURN(EnumerableShardingSpec spec,
                   EnumerableShardingSpec::Create(std::move(shards)));
  return ShardingSpec(std::move(spec));
}

absl::StatusOr<ShardingSpec> SpecFromJson(const Json& root) {
  if (root.is_array()) return ShardsFromJson(root, "shards");
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Invalid JSON sharding spec: expected an object with a \"type\" field "
        "(or an array of shards), got ",
        root.type_name()));
  }
  const Json* type = FindField(root, "type");
  if (type == nullptr) return FieldError("type", "is missing");
  if (!type->is_string()) {
    return FieldError(
        "type", absl::StrCat("must be a string, got ", type->type_name()));
  }
  const std::string kind = type->get<std::string>();
  if (kind == "chunk") return ChunkFromJson(root);
  if (kind == "enumerable" || kind == "enum") {
    RETURN_IF_ERROR(CheckKeys(root, "enumerable spec", {"type", "shards"}));
    const Json* shards = FindField(root, "shards");
    if (shards == nullptr) return FieldError("shards", "is missing");
    return ShardsFromJson(*shards, "shards");
  }
  return FieldError("type", absl::StrCat("must be \"chunk\" or \"enumerable\", "
                                         "got \"",
                                         kind, "\""));
}

// ---------------------------------------------------------------- JSON out.

using OrderedJson = nlohmann::ordered_json;

OrderedJson ShardJson(const ShardMetadata& shard) {
  OrderedJson object = OrderedJson::object();
  object["offsets"] = shard.shard_offsets();
  object["sizes"] = shard.shard_sizes();
  if (shard.placement().has_value()) {
    object["placement"] = shard.placement()->ToString();
  } else {
    object["placement"] = nullptr;
  }
  return object;
}

OrderedJson ShardsJson(absl::Span<const ShardMetadata> shards) {
  OrderedJson array = OrderedJson::array();
  for (const ShardMetadata& shard : shards) array.push_back(ShardJson(shard));
  return array;
}

// Placement text is user-controlled (worker names); never throw on bad
// UTF-8, replace it.
std::string Dump(const OrderedJson& json) {
  return json.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ParseSizes(absl::string_view text) {
  return ParseIntList(text, "size", "sizes", /*allow_empty=*/false);
}

absl::StatusOr<ShardingSpec> ParseShardingSpec(absl::string_view text) {
  const absl::string_view stripped = absl::StripAsciiWhitespace(text);
  const size_t colon = stripped.find(':');
  const absl::string_view kind = absl::StripAsciiWhitespace(stripped.substr(
      0, colon == absl::string_view::npos ? stripped.size() : colon));
  if (colon != absl::string_view::npos) {
    const absl::string_view body = stripped.substr(colon + 1);
    if (kind == "chunk") return ParseChunk(body, stripped);
    if (kind == "enum" || kind == "enumerable") {
      return ParseEnumerable(body, stripped);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("Invalid sharding spec '", text, "': expected ",
                   kChunkGrammar, " or ", kEnumGrammar));
}

absl::StatusOr<ShardingSpec> ShardingSpecFromJson(absl::string_view json) {
  Json root;
  try {
    root = Json::parse(json.begin(), json.end());
  } catch (const Json::exception& e) {
    // Drop nlohmann's "[json.exception.parse_error.101] " tag.
    absl::string_view what = e.what();
    if (const size_t tag_end = what.find("] ");
        absl::StartsWith(what, "[json.exception.") &&
        tag_end != absl::string_view::npos) {
      what.remove_prefix(tag_end + 2);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid JSON sharding spec: ", what));
  }
  try {
    return SpecFromJson(root);
  } catch (const Json::exception& e) {
    // Unreachable: every access above is type-checked first.
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid JSON sharding spec: ", e.what()));
  }
}

std::string ShardingSpecToText(const ShardingSpec& spec) {
  if (const auto* chunk = std::get_if<ChunkShardingSpec>(&spec)) {
    return absl::StrCat(
        "chunk:dim=", chunk->dim(), ":",
        absl::StrJoin(chunk->placements(), ",",
                      [](std::string* out, const RemoteDevice& device) {
                        absl::StrAppend(out, device.ToString());
                      }));
  }
  const auto& enumerable = std::get<EnumerableShardingSpec>(spec);
  return absl::StrCat(
      "enum:", absl::StrJoin(
                   enumerable.shards(), ";",
                   [](std::string* out, const ShardMetadata& shard) {
                     absl::StrAppend(
                         out, absl::StrJoin(shard.shard_offsets(), ","), ":",
                         absl::StrJoin(shard.shard_sizes(), ","));
                     if (shard.placement().has_value()) {
                       absl::StrAppend(out, "@", shard.placement()->ToString());
                     }
                   }));
}

std::string ShardingSpecToJson(const ShardingSpec& spec) {
  OrderedJson json = OrderedJson::object();
  if (const auto* chunk = std::get_if<ChunkShardingSpec>(&spec)) {
    json["type"] = "chunk";
    json["dim"] = chunk->dim();
    OrderedJson placements = OrderedJson::array();
    for (const RemoteDevice& device : chunk->placements()) {
      placements.push_back(device.ToString());
    }
    json["placements"] = std::move(placements);
  } else {
    json["type"] = "enumerable";
    json["shards"] =
        ShardsJson(std::get<EnumerableShardingSpec>(spec).shards());
  }
  return Dump(json);
}

std::string ShardsToJson(absl::Span<const ShardMetadata> shards) {
  return Dump(ShardsJson(shards));
}

}  // namespace tessera
