#include "server/sharded/sharding_plan.h"

#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/proto_convert.h"
#include "common/status_macros.h"
#include "server/collective/process_group.h"
#include "server/rank/rank.h"
#include "server/sharded/shard_api.h"

namespace tessera {
namespace {

using SharderPtr = std::shared_ptr<Sharder>;

const SharderPtr* SharderOf(const ShardingPlan::Entry& entry) {
  return std::get_if<SharderPtr>(&entry);
}

// rpartition('.'): the module path and the last name of a dotted path.
std::pair<absl::string_view, absl::string_view> SplitLast(
    absl::string_view path) {
  const size_t dot = path.rfind('.');
  if (dot == absl::string_view::npos) return {"", path};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

// The outermost Sharder path that `path` lies under: a proper prefix at a
// '.', or `path` itself when `inclusive`. Null when there is none. Looks up
// each prefix, so a check costs O(depth * log(plan size)).
const std::string* EnclosingSharder(const ShardingPlan& plan,
                                    absl::string_view path, bool inclusive) {
  for (size_t end = path.find('.');; end = path.find('.', end + 1)) {
    if (end == absl::string_view::npos && !inclusive) return nullptr;
    auto it = plan.plan.find(std::string(path.substr(0, end)));
    if (it != plan.plan.end() && SharderOf(it->second) != nullptr) {
      return &it->first;
    }
    if (end == absl::string_view::npos) return nullptr;
  }
}

std::string Conflict(absl::string_view what, absl::string_view sharder_path) {
  return absl::StrCat("ShardingPlan is in-valid, trying to shard ", what,
                      ", but there's already a Sharder entry for module ",
                      sharder_path);
}

// The checks that depend on the plan alone.
absl::Status CheckPlan(const ShardingPlan& plan) {
  for (const auto& [name, entry] : plan.plan) {
    const SharderPtr* sharder = SharderOf(entry);
    if (sharder == nullptr) continue;
    if (*sharder == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Only `ShardingSpec` and `Sharder` are supported to shard '", name,
          "'"));
    }
    if (name.empty()) {
      return absl::InvalidArgumentError(
          "Module path must not be empty for custom sharder!");
    }
  }
  for (const auto& [name, entry] : plan.plan) {
    const bool is_sharder = SharderOf(entry) != nullptr;
    const std::string* outer =
        is_sharder ? EnclosingSharder(plan, name, /*inclusive=*/false)
                   : EnclosingSharder(plan, SplitLast(name).first,
                                      /*inclusive=*/true);
    if (outer == nullptr) continue;
    if (is_sharder) {
      return absl::InvalidArgumentError(absl::StrCat(
          Conflict(absl::StrCat("module: ", name, " with a Sharder"), *outer),
          ", which should not conflict with the submodule tree that a "
          "Sharder is working with!"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        Conflict(absl::StrCat("a parameter: ", name), *outer),
        ", parameter sharding should not conflict with the submodule tree "
        "that a Sharder is working with!"));
  }
  return absl::OkStatus();
}

// A module path that must exist before sharding: one outside every
// Sharder's subtree.
absl::Status CheckModulePath(const Module& module, const ShardingPlan& plan,
                             const std::string& path) {
  if (EnclosingSharder(plan, path, /*inclusive=*/true) != nullptr) {
    return absl::OkStatus();
  }
  return module.GetSubmodule(path).status();
}

// Everything that can be known before changing the module.
absl::Status CheckPlanOnModule(const Module& module, const ShardingPlan& plan) {
  RETURN_IF_ERROR(CheckPlan(plan));
  for (const auto& [name, entry] : plan.plan) {
    if (SharderOf(entry) != nullptr) {
      RETURN_IF_ERROR(module.GetSubmodule(name).status());
    } else {
      RETURN_IF_ERROR(ParameterToShard(module, name).status());
    }
  }
  for (const auto& [path, spec] : plan.output_plan) {
    RETURN_IF_ERROR(CheckModulePath(module, plan, path));
  }
  for (const std::string& path : plan.return_local_tensor) {
    RETURN_IF_ERROR(CheckModulePath(module, plan, path));
  }
  return absl::OkStatus();
}

void AppendField(std::string& out, absl::string_view field) {
  absl::StrAppend(&out, field.size(), ":", field);
}

void AppendSpec(std::string& out, const ShardingSpec& spec) {
  AppendField(out, ToProto(spec).SerializeAsString());
}

// The plan and src_rank as bytes that are equal exactly when two members'
// plans are (Sharders count by position, not by identity).
std::string Fingerprint(const ShardingPlan& plan, int src_rank) {
  std::string out = absl::StrCat(src_rank, ";");
  for (const auto& [name, entry] : plan.plan) {
    AppendField(out, name);
    if (const auto* spec = std::get_if<ShardingSpec>(&entry)) {
      AppendSpec(out, *spec);
    } else {
      out += "sharder;";
    }
  }
  out += "output;";
  for (const auto& [path, spec] : plan.output_plan) {
    AppendField(out, path);
    AppendSpec(out, spec);
  }
  out += "local;";
  for (const std::string& path : plan.return_local_tensor) {
    AppendField(out, path);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> GroupOf(
    const ShardedTensorOptions& options) {
  std::shared_ptr<Rank> rank =
      options.rank != nullptr ? options.rank : DefaultRank();
  if (rank == nullptr) {
    return absl::FailedPreconditionError(
        "shard_module: no rank; call tessera::Rank::Init (and "
        "SetDefaultRank) or pass a rank");
  }
  std::shared_ptr<ProcessGroup> group = options.process_group != nullptr
                                            ? options.process_group
                                            : rank->default_group();
  if (!group->is_member()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard_module: rank ", rank->rank(),
                     " is not a member of process group ", group->name()));
  }
  return group;
}

// Every member's check outcome ('E', the code and the message, or 'O' and
// the plan's fingerprint): the member's own error first, then the lowest
// failing member's, then the first member whose plan differs.
absl::Status AgreeOnPlan(ProcessGroup& group, const absl::Status& local,
                         const std::string& fingerprint) {
  std::string mine =
      local.ok()
          ? absl::StrCat("O", fingerprint)
          : absl::StrCat("E", std::string(1, static_cast<char>(local.code())),
                         local.message());
  ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                   AllGatherBytes(group, mine));
  RETURN_IF_ERROR(local);
  const std::vector<int>& ranks = group.global_ranks();
  for (size_t r = 0; r < gathered.size(); ++r) {
    absl::string_view theirs = gathered[r];
    if (theirs.size() >= 2 && theirs[0] == 'E') {
      return absl::Status(
          static_cast<absl::StatusCode>(theirs[1]),
          absl::StrCat("on rank ", ranks[r], ": ", theirs.substr(2)));
    }
  }
  for (size_t r = 0; r < gathered.size(); ++r) {
    if (gathered[r] != mine) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sharding plan on rank: ", ranks[group.rank()],
          " does not match with sharding plan on rank: ", ranks[r]));
    }
  }
  return absl::OkStatus();
}

// Replaces the submodule at `path` by what `sharder` makes of it.
absl::Status ApplySharder(Module& module, const std::string& path,
                          Sharder& sharder) {
  const auto [parent_path, name] = SplitLast(path);
  ASSIGN_OR_RETURN(Module * parent, module.GetSubmodule(parent_path));
  std::shared_ptr<Module> child;
  for (const auto& [key, value] : parent->children()) {
    if (key == name) child = value;
  }
  if (child == nullptr) return module.GetSubmodule(path).status();
  ASSIGN_OR_RETURN(std::shared_ptr<Module> sharded, sharder.Shard(child));
  if (sharded == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Sharder for '", path, "' returned no module"));
  }
  return parent->AddModule(std::string(name), std::move(sharded));
}

}  // namespace

absl::Status ShardModule(Module& module, const ShardingPlan& plan, int src_rank,
                         const ShardedTensorOptions& options) {
  const absl::Status local = CheckPlanOnModule(module, plan);
  absl::StatusOr<std::shared_ptr<ProcessGroup>> group = GroupOf(options);
  // Without a group the mistake cannot be shared; the plan's own is the
  // more useful message.
  if (!group.ok()) return local.ok() ? group.status() : local;
  RETURN_IF_ERROR(AgreeOnPlan(**group, local, Fingerprint(plan, src_rank)));

  for (const auto& [name, entry] : plan.plan) {
    if (const auto* spec = std::get_if<ShardingSpec>(&entry)) {
      RETURN_IF_ERROR(ShardParameter(module, name, *spec, src_rank, options));
    }
  }
  for (const auto& [name, entry] : plan.plan) {
    if (const SharderPtr* sharder = SharderOf(entry)) {
      RETURN_IF_ERROR(ApplySharder(module, name, **sharder));
    }
  }
  for (const auto& [path, spec] : plan.output_plan) {
    ASSIGN_OR_RETURN(Module * target, module.GetSubmodule(path));
    ReshardOutput(*target, spec);
  }
  for (const std::string& path : plan.return_local_tensor) {
    ASSIGN_OR_RETURN(Module * target, module.GetSubmodule(path));
    CollectLocalShard(*target);
  }
  return absl::OkStatus();
}

}  // namespace tessera
