// Page-wide pieces: the error banner and the confirm dialog (both in index.html).

const banner = () => document.getElementById("error-banner");
let bannerSource = null;

/** Show an error (an ApiError or any Error) in #error-banner. ``source`` tags where it came
 * from: a background refresh clears its own error once it works again, but never an
 * action's, which stays until dismissed or the page changes. */
export function showError(err, source = "action") {
  if (err && err.name === "AbortError") return;
  const box = banner();
  const title = err.title && err.detail ? `${err.title}: ` : "";
  box.querySelector(".msg").textContent = `${title}${err.detail || err.message || err}`;
  box.querySelector(".hint").textContent = err.hint || "";
  box.hidden = false;
  bannerSource = source;
}

export function clearError(source = null) {
  if (source === null || source === bannerSource) {
    banner().hidden = true;
    bannerSource = null;
  }
}

export function initBanner() {
  banner().querySelector(".dismiss").addEventListener("click", () => clearError());
}

/** Ask before doing something: resolves true (or the priority entered) when confirmed,
 * false when cancelled (Cancel, Escape). With ``priority`` (a number) the dialog asks for
 * a new priority, prefilled. */
export function confirmDialog(text, {ok = "OK", priority = null} = {}) {
  const dialog = document.getElementById("confirm");
  const form = dialog.querySelector("form");
  const input = document.getElementById("priority-value");
  const okButton = document.getElementById("confirm-ok");
  const cancel = document.getElementById("confirm-cancel");
  document.getElementById("confirm-text").textContent = text;
  okButton.textContent = ok;
  okButton.classList.toggle("danger", priority === null && ok !== "OK");
  okButton.classList.toggle("primary", priority !== null);
  input.closest("label").hidden = priority === null;
  input.value = priority === null ? "" : String(priority);
  input.required = priority !== null;
  const opener = document.activeElement;

  return new Promise((resolve) => {
    const done = (value) => {
      form.removeEventListener("submit", onSubmit);
      cancel.removeEventListener("click", onCancel);
      dialog.removeEventListener("close", onClose);
      if (dialog.open) dialog.close();
      if (opener && opener.isConnected) opener.focus();
      resolve(value);
    };
    const onSubmit = (event) => {
      event.preventDefault();
      done(priority === null ? true : input.value.trim());
    };
    const onCancel = () => done(false);
    const onClose = () => done(false); // Escape
    form.addEventListener("submit", onSubmit);
    cancel.addEventListener("click", onCancel);
    dialog.addEventListener("close", onClose);
    dialog.showModal();
    // A destructive action starts on Cancel, so Enter alone does not confirm it.
    (priority === null ? cancel : input).focus();
    if (priority !== null) input.select();
  });
}
