// A binary's settings as one table. Each setting is declared once, with its
// flag, the environment variables it falls back to, its default, how its
// text becomes part of the options (parsing and validation) and its help;
// the command line parser, --help, resolution and the errors that say where
// a bad value came from all read that one declaration. `tessera-server`
// (DaemonSettings, server/daemon/daemon_options.h) and `tessera launch`
// (LaunchSettings, client/cli/launch/launch_command.h) each build one.
//
// Two structs meet in a table: `Flags`, the command line as given (a
// std::optional<std::string> per valued setting, a std::vector<std::string>
// per repeatable one, a bool per switch), and `Options`, what the program
// runs with. Resolution, setting by setting in declaration order:
//
//   1. the flag, when given (even as an empty text);
//   2. else the first of its variables set to a non-empty value;
//   3. else its default: a fixed text, or one computed from the settings
//      declared before it;
//   4. else nothing: the field keeps the value Options starts with (which
//      DefaultNote describes in the help).
//
// The text goes to the setting's Apply with its source: the flag ("--rank",
// also for a default) or the variable ("RANK"); then its Checks run with
// the same source. So every message names where the bad value came from:
// "RANK must be in [0, 1048576], got -1". A later setting's Apply, Checks
// and computed default see the fields the earlier ones set; declare a
// setting after those it depends on.
//
// Failures are values: Resolve returns the first failing setting's status
// (INVALID_ARGUMENT from the helpers here, or whatever an Apply or Check
// returns) and stops there; a required setting that nothing gives is
// INVALID_ARGUMENT naming its flag and variables.
//
// AddTo declares the settings on a CLI11 app (CLI::App), storing what the
// command line gives into a Flags object that must outlive the parse. It is
// a template so that common/ needs no parser: only the binaries that parse
// include CLI11.
//
// Thread-compatible: build a table, then read it from any number of threads
// (every reading method is const). No I/O: variables are read through the
// caller's getenv, so tests supply their own. The table owns its settings
// and the functions they hold; those may capture state of the caller's
// (tessera-server's device setting captures the machine's description),
// which must then outlive the table.
#ifndef TESSERA_COMMON_SETTING_TABLE_H_
#define TESSERA_COMMON_SETTING_TABLE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

// A setting's text and where it came from.
struct SettingValue {
  // What errors name: the flag ("--timeout"; also for a default) or the
  // variable ("TESSERA_TIMEOUT") the text was read from.
  std::string source;
  std::string text;

  // "<source> must be an integer, got '<text>'" unless it is one.
  absl::StatusOr<int> ToInt() const;
  // "<source> must be a number, got '<text>'" unless it is one.
  absl::StatusOr<double> ToNumber() const;
  // ToInt, then "<source> must be in [min, max], got <n>" outside it.
  absl::StatusOr<int> ToIntIn(int min, int max) const;
  // "true" or "false" in any case; else "<source> must be true or false;
  // got '<text>'".
  absl::StatusOr<bool> ToBool() const;
};

// "<source> must be in [min, max], got <value>" outside it, else OK.
absl::Status SettingInRange(absl::string_view source, int64_t value, int min,
                            int max);

// The value of an environment variable; nullopt when unset.
using SettingGetenv =
    std::function<std::optional<std::string>(const std::string& name)>;

namespace setting_table_internal {
// The first of `variables` set to a non-empty value; nullopt when none is
// (or `getenv` is empty).
std::optional<SettingValue> FromEnvironment(
    const std::vector<std::string>& variables, const SettingGetenv& getenv);
// "<help> [env A, B; default D]", the parts that exist.
std::string HelpLine(const std::string& help,
                     const std::vector<std::string>& variables,
                     const std::string& default_help);
// What a required setting nothing gave says: "<flag> is required" (as
// CLI11 says it), or "no <what>: pass <flag> or set A (or B, C)".
std::string MissingMessage(const std::string& flag, const std::string& what,
                           const std::vector<std::string>& variables);
}  // namespace setting_table_internal

template <typename Flags, typename Options>
class SettingTable {
 public:
  // Parses and validates a setting's text into `options`; errors name
  // `value.source`.
  using ApplyFn =
      std::function<absl::Status(const SettingValue& value, Options& options)>;
  // Validates the setting's field once set; errors name `source`.
  using CheckFn = std::function<absl::Status(absl::string_view source,
                                             const Options& options)>;
  // A default computed from the settings declared before.
  using DefaultFn = std::function<std::string(const Options& options)>;

  // One row of the table, declared with chained calls:
  //
  //   table.Add("--timeout", &DaemonFlags::timeout)
  //       .Env({"TESSERA_TIMEOUT"})
  //       .Default("60s")
  //       .Help("DURATION", "rendezvous and collective timeout")
  //       .Apply(...);
  class Setting {
   public:
    // Another name of the flag ("--nproc-per-node").
    Setting& Alias(std::string name) {
      aliases_.push_back(std::move(name));
      return *this;
    }
    // Variables tried in order when the flag is not given.
    Setting& Env(std::vector<std::string> variables) {
      env_ = std::move(variables);
      return *this;
    }
    // Applied as if given when neither the flag nor a variable is.
    Setting& Default(std::string text) {
      default_help_ = text;
      default_text_ = std::move(text);
      return *this;
    }
    // A default computed from the settings before this one; `described`
    // is what the help says of it ("29600 + local rank").
    Setting& Default(DefaultFn compute, std::string described) {
      compute_default_ = std::move(compute);
      default_help_ = std::move(described);
      return *this;
    }
    // No default is applied; `described` says in the help what the
    // field's starting value means ("unknown", "none: not served").
    Setting& DefaultNote(std::string described) {
      default_help_ = std::move(described);
      return *this;
    }
    // Resolution fails when nothing gives it; `what` names it in the
    // message of a setting with variables ("no rank: pass --rank or set
    // RANK"). Without variables, the parser requires the flag itself.
    Setting& Required(std::string what) {
      required_ = true;
      what_ = std::move(what);
      return *this;
    }
    // The help line; `value_name` ("N", "DURATION") follows the flag.
    Setting& Help(std::string value_name, std::string help) {
      value_name_ = std::move(value_name);
      help_ = std::move(help);
      return *this;
    }
    // How a text becomes part of Options (a repeatable setting's, once per
    // value). Replaces any earlier Apply.
    Setting& Apply(ApplyFn apply) {
      apply_ = std::move(apply);
      return *this;
    }
    // Adds a validation of the field, run after Apply (in order) and by
    // Validate.
    Setting& Check(CheckFn check) {
      checks_.push_back(std::move(check));
      return *this;
    }

    // Common Applies: the text as it is; an integer (in [min, max]); a
    // number; true or false (a switch given is "true"); each value of a
    // repeatable setting, appended.
    Setting& Text(std::string Options::*field) {
      return Apply([field](const SettingValue& value, Options& options) {
        options.*field = value.text;
        return absl::OkStatus();
      });
    }
    Setting& Int(int Options::*field) {
      return Apply([field](const SettingValue& value, Options& options) {
        absl::StatusOr<int> parsed = value.ToInt();
        if (!parsed.ok()) return parsed.status();
        options.*field = *parsed;
        return absl::OkStatus();
      });
    }
    Setting& Int(int Options::*field, int min, int max) {
      // Parsed within [min, max], so that a whole number beyond int is
      // told the range; the check covers a default or computed value.
      Apply([field, min, max](const SettingValue& value, Options& options) {
        absl::StatusOr<int> parsed = value.ToIntIn(min, max);
        if (!parsed.ok()) return parsed.status();
        options.*field = *parsed;
        return absl::OkStatus();
      });
      return Check(
          [field, min, max](absl::string_view source, const Options& options) {
            return SettingInRange(source, options.*field, min, max);
          });
    }
    Setting& Number(double Options::*field) {
      return Apply([field](const SettingValue& value, Options& options) {
        absl::StatusOr<double> parsed = value.ToNumber();
        if (!parsed.ok()) return parsed.status();
        options.*field = *parsed;
        return absl::OkStatus();
      });
    }
    Setting& Bool(bool Options::*field) {
      return Apply([field](const SettingValue& value, Options& options) {
        absl::StatusOr<bool> parsed = value.ToBool();
        if (!parsed.ok()) return parsed.status();
        options.*field = *parsed;
        return absl::OkStatus();
      });
    }
    Setting& List(std::vector<std::string> Options::*field) {
      return Apply([field](const SettingValue& value, Options& options) {
        (options.*field).push_back(value.text);
        return absl::OkStatus();
      });
    }

    const std::string& flag() const { return flag_; }
    const std::vector<std::string>& env() const { return env_; }
    // The flag and its aliases, comma-separated, as CLI11 takes them.
    std::string names() const {
      std::string names = flag_;
      for (const std::string& alias : aliases_) names += "," + alias;
      return names;
    }
    // The help line the parser shows: the help, then "[env A, B;
    // default D]".
    std::string help_line() const {
      return setting_table_internal::HelpLine(help_, env_, default_help_);
    }

   private:
    friend class SettingTable;
    enum class Kind { kValue, kList, kSwitch };

    std::string flag_;
    Kind kind_ = Kind::kValue;
    std::optional<std::string> Flags::*value_ = nullptr;
    std::vector<std::string> Flags::*list_ = nullptr;
    bool Flags::*switch_ = nullptr;
    std::vector<std::string> aliases_;
    std::vector<std::string> env_;
    std::optional<std::string> default_text_;
    DefaultFn compute_default_;
    std::string default_help_;
    bool required_ = false;
    std::string what_;
    std::string value_name_;
    std::string help_;
    ApplyFn apply_;
    std::vector<CheckFn> checks_;
  };

  // A setting whose value the command line gives as one text.
  Setting& Add(std::string flag, std::optional<std::string> Flags::*given) {
    Setting& setting = NewSetting(std::move(flag), Setting::Kind::kValue);
    setting.value_ = given;
    return setting;
  }
  // A repeatable setting (a name without dashes: positional arguments).
  Setting& Add(std::string flag, std::vector<std::string> Flags::*given) {
    Setting& setting = NewSetting(std::move(flag), Setting::Kind::kList);
    setting.list_ = given;
    return setting;
  }
  // A switch: given means "true".
  Setting& Add(std::string flag, bool Flags::*given) {
    Setting& setting = NewSetting(std::move(flag), Setting::Kind::kSwitch);
    setting.switch_ = given;
    return setting;
  }

  // In declaration order (references stay valid as settings are added).
  const std::deque<Setting>& settings() const { return settings_; }

  // Resolves every setting into `options` (see the top of this file); the
  // first failure, and `options` half set.
  absl::Status Resolve(const Flags& flags, const SettingGetenv& getenv,
                       Options& options) const {
    for (const Setting& setting : settings_) {
      std::vector<SettingValue> values = Given(setting, flags);
      if (values.empty()) {
        if (std::optional<SettingValue> from_env =
                setting_table_internal::FromEnvironment(setting.env_, getenv)) {
          values.push_back(*std::move(from_env));
        } else if (setting.default_text_.has_value()) {
          values.push_back({setting.flag_, *setting.default_text_});
        } else if (setting.compute_default_) {
          values.push_back({setting.flag_, setting.compute_default_(options)});
        } else if (setting.required_) {
          return absl::InvalidArgumentError(
              setting_table_internal::MissingMessage(
                  setting.flag_, setting.what_, setting.env_));
        }
      }
      for (const SettingValue& value : values) {
        if (setting.apply_) {
          absl::Status applied = setting.apply_(value, options);
          if (!applied.ok()) return applied;
        }
        absl::Status checked = RunChecks(setting, value.source, options);
        if (!checked.ok()) return checked;
      }
    }
    return absl::OkStatus();
  }

  // Runs every setting's checks on `options` however they were filled in
  // (by Resolve, or by code), naming the flags.
  absl::Status Validate(const Options& options) const {
    for (const Setting& setting : settings_) {
      absl::Status checked = RunChecks(setting, setting.flag_, options);
      if (!checked.ok()) return checked;
    }
    return absl::OkStatus();
  }

  // Applies every fixed default (not the computed ones) to `options`: what
  // a program that takes no flags runs with.
  absl::Status SetDefaults(Options& options) const {
    for (const Setting& setting : settings_) {
      if (!setting.default_text_.has_value() || !setting.apply_) continue;
      absl::Status applied =
          setting.apply_({setting.flag_, *setting.default_text_}, options);
      if (!applied.ok()) return applied;
    }
    return absl::OkStatus();
  }

  // Declares every setting on `app`, a CLI::App (CLI11), with its names,
  // value name and help line, storing what is given into `flags`.
  template <typename App>
  void AddTo(App& app, Flags& flags) const {
    for (const Setting& setting : settings_) {
      const std::string names = setting.names();
      const std::string help = setting.help_line();
      auto* option = [&] {
        if (setting.kind_ == Setting::Kind::kList) {
          return app.add_option(names, flags.*(setting.list_), help);
        }
        if (setting.kind_ == Setting::Kind::kSwitch) {
          return app.add_flag(names, flags.*(setting.switch_), help);
        }
        std::optional<std::string> Flags::*field = setting.value_;
        return app.template add_option_function<std::string>(
            names,
            [&flags, field](const std::string& text) { flags.*field = text; },
            help);
      }();
      if (!setting.value_name_.empty()) option->type_name(setting.value_name_);
      if (setting.required_ && setting.env_.empty()) option->required();
    }
  }

 private:
  Setting& NewSetting(std::string flag, typename Setting::Kind kind) {
    Setting& setting = settings_.emplace_back();
    setting.flag_ = std::move(flag);
    setting.kind_ = kind;
    return setting;
  }

  // What the command line gave, each value named by the flag.
  static std::vector<SettingValue> Given(const Setting& setting,
                                         const Flags& flags) {
    std::vector<SettingValue> values;
    switch (setting.kind_) {
      case Setting::Kind::kValue:
        if (const auto& given = flags.*(setting.value_); given.has_value()) {
          values.push_back({setting.flag_, *given});
        }
        break;
      case Setting::Kind::kList:
        for (const std::string& given : flags.*(setting.list_)) {
          values.push_back({setting.flag_, given});
        }
        break;
      case Setting::Kind::kSwitch:
        if (flags.*(setting.switch_)) values.push_back({setting.flag_, "true"});
        break;
    }
    return values;
  }

  static absl::Status RunChecks(const Setting& setting,
                                absl::string_view source,
                                const Options& options) {
    for (const CheckFn& check : setting.checks_) {
      absl::Status checked = check(source, options);
      if (!checked.ok()) return checked;
    }
    return absl::OkStatus();
  }

  std::deque<Setting> settings_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_SETTING_TABLE_H_
