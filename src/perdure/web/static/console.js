// Confirm each action before it is sent, and refresh a live run's page while
// nobody is typing in it.
document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

if (document.body.dataset.live === "1" && !document.querySelector("[data-answer]")) {
  setInterval(() => {
    const typing = document.activeElement && document.activeElement.closest("form");
    if (!typing) {
      window.location.reload();
    }
  }, 5000);
}
