# The bundled terraform example: only the built-in terraform_data resource,
# so it works offline with the local state backend. Change `greeting` in
# example.tfvars, commit, and the next tick reports `changed`.
variable "greeting" {
  type    = string
  default = "hello"
}

resource "terraform_data" "greeting" {
  input = var.greeting
}

output "greeting" {
  value = terraform_data.greeting.output
}
